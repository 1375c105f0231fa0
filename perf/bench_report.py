"""The duplex benchmark's report: raw JSON, and a markdown page with the reference table.

Everything renders from the JSON form of the levels (`LevelResult.to_json`), so runs made in
parts (one server start per part) merge into one report (perf/bench_merge.py).

The reference is vLLM-Omni's published MiniCPM-o 4.5 table (1x H200, Seed-TTS duplex realtime
benchmark, 4 turns per session, num_prompts = 2 x C), V1 -> MRv2; our headline TTFP is the
server's `ttfp_ms` (acceptance of the triggering unit -> first audio), as theirs is.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perf.stage_breakdown import ServerSeries, step_time_per_unit

Level = dict[str, Any]  # LevelResult.to_json()

# C -> ((TTFP mean V1, MRv2), (TTFP P99 V1, MRv2), (RTF median V1, MRv2), (RTF P99 V1, MRv2))
REFERENCE = {
    1: ((739, 692), (778, 716), (1.13, 1.12), (1.15, 1.14)),
    2: ((775, 726), (893, 738), (1.14, 1.11), (1.16, 1.24)),
    4: ((643, 606), (816, 722), (1.20, 1.15), (1.30, 1.24)),
    8: ((572, 493), (823, 687), (1.50, 1.31), (1.76, 1.69)),
}
GOAL = ("Goal: at every C <= 16, TTFP mean at most half of the best reference "
        "(best rerun: 213 ms at C=1, 540 ms at C=8) and RTF median <= 1.05; at C=32 TTFP P99 < 1 s "
        "with no failed session.")
STAGES = ("thinker", "talker", "code2wav")
READING_NOTES = (
    "Client TTFT/TTFP start at the turn's first 200 ms append, so they include the 0.8 s until the "
    "first 1-second unit is complete; the server's values start at that unit's acceptance (the "
    "reference reports the server's).",
    "RTF counts from the turn's first append to the last chunk. With random weights the Talker "
    "rarely samples EOS, so the turn-end unit fills its 104-frame budget (about 4 s of audio at once) "
    "where the real model stops when the speech ends: replies are about 3 s longer than their "
    "units, which lowers RTF against the real model's shape.",
)


def write_json(path: Path, meta: dict[str, Any], levels: Sequence[Level]) -> None:
    path.write_text(json.dumps({**meta, "levels": list(levels)}, indent=1) + "\n", encoding="utf-8")


def render_markdown(title: str, meta: dict[str, Any], levels: Sequence[Level]) -> str:
    lines = [f"# {title}", "", *_meta_lines(meta), "", "## Results", "", *_main_table(levels), "",
             "## Side by side with vLLM-Omni (MiniCPM-o 4.5, 1x H200)", "", *_reference_table(levels), "",
             GOAL, "", "## Stage breakdown per unit", "", *_stage_tables(levels), ""]
    server = [line for level in levels for line in _server_lines(level)]
    if server:
        lines += ["Server metrics over each level (`minicpmo_*` histograms: observations, mean per observation, "
                  "in the family's unit):", "",
                  "| C | family | model | observations | mean | P99 under (bucket bound) |", "|---|---|---|---|---|---|",
                  *server, ""]
    notes = [*meta.get("notes", []), *READING_NOTES]
    lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    return "\n".join(lines)


def _meta_lines(meta: dict[str, Any]) -> list[str]:
    keys = ("command", "commit", "device", "profile", "workload", "started", "switches")
    return [f"- {key}: `{meta[key]}`" if key == "command" else f"- {key}: {meta[key]}" for key in keys if key in meta]


def _main_table(levels: Sequence[Level]) -> list[str]:
    head = ("| C | groups (failed) | turns (failed, skipped) | errors | TTFT srv mean | TTFP srv mean / median / P99 | "
            "TTFP client mean / P99 | RTF mean / median / P99 | underrun turns | max gap P99 | turns/s | "
            "append lag max |")
    rows = [head, "|" + "---|" * 12]
    for level in levels:
        s = level["summary"]
        m = s["metrics"]
        rows.append(
            f"| {s['concurrency']} | {s['num_groups']} ({s['failed_groups']}) | {s['num_turns']} ({s['failed_turns']}, "
            f"{s.get('skipped_turns', 0)}) | {s['num_errors']} | {_ms(m['server_ttft_ms']['mean'])} | "
            f"{_trio(m['server_ttfp_ms'], _ms)} | {_ms(m['client_ttfp_ms']['mean'])} / {_ms(m['client_ttfp_ms']['p99'])} | "
            f"{_trio(m['rtf'], _ratio)} | {s['turns_with_underrun']} | {_ms(s['turn_max_gap_ms']['p99'])} | "
            f"{s['turns_per_s']:.2f} | {_ms(s['pacing_lateness_ms']['max'])} |")
    return rows


def _reference_table(levels: Sequence[Level]) -> list[str]:
    rows = ["| C | TTFP mean: ours / V1 -> MRv2 (ms) | TTFP P99: ours / V1 -> MRv2 | "
            "RTF median: ours / V1 -> MRv2 | RTF P99: ours / V1 -> MRv2 | peak GPU MiB |", "|---|---|---|---|---|---|"]
    for level in levels:
        s = level["summary"]
        ref = REFERENCE.get(s["concurrency"])
        ttfp, rtf = s["metrics"]["ttfp_ms"], s["metrics"]["rtf"]
        cells = [_ms(ttfp["mean"]), _ms(ttfp["p99"]), _ratio(rtf["median"]), _ratio(rtf["p99"])]
        refs = [f"{a} -> {b}" for a, b in ref] if ref else ["-"] * 4
        peak = level.get("gpu_peak_mib") or {}
        peak_text = " + ".join(f"{v:.0f}" for v in peak.values()) if peak else "-"
        rows.append(f"| {s['concurrency']} | " + " | ".join(f"{c} / {r}" for c, r in zip(cells, refs))
                    + f" | {peak_text} |")
    return rows


def _stage_tables(levels: Sequence[Level]) -> list[str]:
    rows = ["Server step time per unit: each stage's engine step time summed over the level (its "
            "`minicpmo_*step*` histogram) divided by the units it served (every decided unit for the "
            "Thinker, speak units for the others). Steps batch several sessions, so this is the engine "
            "cost of one unit, in ms:", "",
            "| C | units decided / spoken | Thinker | Talker | Code2Wav |", "|---|---|---|---|---|"]
    for level in levels:
        units = level["unit_estimate"]
        series = [ServerSeries(**s) for s in level.get("server_metrics", [])]
        cost = step_time_per_unit(series, units["decided_units"], units["speak_units"])
        rows.append(f"| {level['summary']['concurrency']} | {units['decided_units']} / {units['speak_units']} | "
                    + " | ".join(_ms1(cost.get(stage)) for stage in STAGES) + " |")
    rows += ["", "Latency seen by a session, from event timestamps (perf/stage_breakdown.py), mean / P99 in ms:", "",
             "| C | Thinker, unit 0 (text prefill) | Thinker, later units | audio tail (Talker + Code2Wav) |",
             "|---|---|---|---|"]
    for level in levels:
        u = level["unit_estimate"]
        rows.append(f"| {level['summary']['concurrency']} | {_pair(u['first_thinker_ms'])} | "
                    f"{_pair(u['thinker_ms'])} | {_pair(u['tail_ms'])} |")
    return rows


def _server_lines(level: Level) -> list[str]:
    c = level["summary"]["concurrency"]
    return [f"| {c} | {s['family']} | {s['model']} | {s['observations']:.0f} | {_num(s['mean'])} "
            f"| {_bound(s.get('p99_bound'))} |" for s in level.get("server_metrics", [])]


def _bound(value: float | None) -> str:
    """A histogram's P99 bucket bound: '-' for none (not a histogram), '> last bucket' beyond it."""
    if value is None:
        return "-"
    return "> last bucket" if value == float("inf") else _num(value)


def _trio(dist: dict[str, Any], fmt: Any) -> str:
    return f"{fmt(dist['mean'])} / {fmt(dist['median'])} / {fmt(dist['p99'])}"


def _pair(dist: dict[str, Any]) -> str:
    return f"{_ms(dist['mean'])} / {_ms(dist['p99'])}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ms1(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
