"""How far duplex benchmark results move between runs (server starts) of the same code.

    python -m perf.bench_spread perf/out/start_a/duplex_a.json perf/out/start_b/duplex_a.json ...

Per concurrency C present in every run: the server TTFP mean of each run and their min /
median / max, each run's TTFP P99, RTF median and underrun turns. A change smaller than the
range at some C is not resolved there by one run per configuration.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class LevelSpread:
    concurrency: int
    ttfp_means: tuple[float, ...]  # server TTFP mean per run, in the runs' order
    ttfp_p99s: tuple[float, ...]
    rtf_medians: tuple[float, ...]
    underrun_turns: tuple[int, ...]

    @property
    def ttfp_range(self) -> float:
        return max(self.ttfp_means) - min(self.ttfp_means)


def load_levels(path: Path) -> dict[int, dict[str, Any]]:
    """C -> that level's summary, from a JSON written by perf.duplex_bench (or bench_merge)."""
    report = json.loads(path.read_text())
    return {level["summary"]["concurrency"]: level["summary"] for level in report["levels"]}


def spread(runs: list[dict[int, dict[str, Any]]]) -> list[LevelSpread]:
    """One row per C that every run measured, by C; a level without a TTFP is left out."""
    if not runs:
        raise ValueError("no runs given")
    common = sorted(set.intersection(*(set(run) for run in runs)))
    rows = []
    for c in common:
        summaries = [run[c] for run in runs]
        ttfp = [s["metrics"].get("server_ttfp_ms") or {} for s in summaries]
        if any(t.get("mean") is None for t in ttfp):
            continue
        rows.append(LevelSpread(
            concurrency=c,
            ttfp_means=tuple(float(t["mean"]) for t in ttfp),
            ttfp_p99s=tuple(float(t["p99"]) for t in ttfp),
            rtf_medians=tuple(float(s["metrics"]["rtf"]["median"]) for s in summaries),
            underrun_turns=tuple(int(s["turns_with_underrun"]) for s in summaries),
        ))
    return rows


def render(rows: list[LevelSpread], names: list[str]) -> str:
    def cells(values: tuple[float, ...], fmt: str) -> str:
        return " / ".join(format(v, fmt) for v in values)

    lines = [f"Runs: {', '.join(names)} (values per run, in this order)", "",
             "| C | TTFP srv mean per run (ms) | min / median / max | range | TTFP P99 per run | RTF median per run | underrun turns per run |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        middle = statistics.median(r.ttfp_means)
        lines.append(f"| {r.concurrency} | {cells(r.ttfp_means, '.0f')} | {min(r.ttfp_means):.0f} / {middle:.0f} / "
                     f"{max(r.ttfp_means):.0f} | {r.ttfp_range:.0f} | {cells(r.ttfp_p99s, '.0f')} | "
                     f"{cells(r.rtf_medians, '.2f')} | {' / '.join(map(str, r.underrun_turns))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by perf.duplex_bench")
    args = parser.parse_args(argv)
    print(render(spread([load_levels(path) for path in args.runs]), [path.stem for path in args.runs]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
