"""GPU busy and idle time in a torch.profiler Chrome trace: is a step bound by the device or by
the host between its launches?

    python3 perf/trace_gaps.py TRACE.json[.gz] [--top 12] [--min-gap-us 10] [--max-gap-us 50000] [--by-op]

Device events are the trace's `kernel`, `gpu_memcpy` and `gpu_memset` entries (CUDA graph
replays show their kernels one by one). Busy time is the union of their intervals; an idle gap
is time between two device events with nothing running. Each of the largest gaps is printed
with the device event before and after it and the host ops (`cpu_op`, `python_function`, CUDA runtime calls,
annotations) by their time inside the gap: that is where the host spent it.
"""
from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cpu_op", "python_function", "user_annotation", "cuda_runtime"}


@dataclass(frozen=True, slots=True)
class Span:
    start: float  # us
    end: float
    name: str


@dataclass(frozen=True, slots=True)
class Gap:
    start: float
    end: float
    before: str
    after: str

    @property
    def length(self) -> float:
        return self.end - self.start


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def spans(events: list[dict], categories: set[str]) -> list[Span]:
    out = [Span(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
           for e in events if e.get("ph") == "X" and e.get("cat") in categories]
    return sorted(out, key=lambda s: s.start)


def busy_and_gaps(device: list[Span], min_gap: float, max_gap: float = float("inf"),
                  ) -> tuple[float, list[Gap]]:
    """Union of the device intervals (us) and the idle gaps of `min_gap` to `max_gap` us
    (a longer one is the engine waiting for work, not a step's host time)."""
    busy, gaps = 0.0, []
    if not device:
        return busy, gaps
    cur_start, cur_end, last_name = device[0].start, device[0].end, device[0].name
    for span in device[1:]:
        if span.start > cur_end:
            busy += cur_end - cur_start
            if min_gap <= span.start - cur_end <= max_gap:
                gaps.append(Gap(cur_end, span.start, last_name, span.name))
            cur_start = span.start
        if span.end >= cur_end:
            cur_end, last_name = span.end, span.name
    busy += cur_end - cur_start
    return busy, gaps


def host_ops_during(host: list[Span], gap: Gap, limit: int = 5) -> list[str]:
    """Host ops by their time inside the gap ("name us"), largest first; an outer op covers
    the whole gap, the inner ones say what it was doing."""
    ranked = sorted(_overlaps(host, gap).items(), key=lambda item: -item[1])[:limit]
    return [f"{name[:50]} {us:.0f}" for name, us in ranked]


def idle_by_op(host: list[Span], gaps: list[Gap], top: int) -> list[str]:
    """Host ops ranked by their time inside all the gaps together (nested ops count for each
    level, so an outer op shows the whole of what it contains)."""
    total: dict[str, float] = {}
    for gap in gaps:
        for name, us in _overlaps(host, gap).items():
            total[name] = total.get(name, 0.0) + us
    ranked = sorted(total.items(), key=lambda item: -item[1])[:top]
    return [f"| {us / 1000:.2f} | {name[:90]} |" for name, us in ranked]


def _overlaps(host: list[Span], gap: Gap) -> dict[str, float]:
    inside: dict[str, float] = {}
    for h in host:
        overlap = min(h.end, gap.end) - max(h.start, gap.start)
        if overlap > 0:
            inside[h.name] = inside.get(h.name, 0.0) + overlap
    return inside


def report(path: Path, top: int, min_gap: float, max_gap: float = float("inf"),
           by_op: bool = False) -> str:
    events = load_events(path)
    device = spans(events, DEVICE_CATEGORIES)
    if not device:
        return f"{path}: no device events (a CPU-only trace?)"
    host = spans(events, HOST_CATEGORIES)
    busy, gaps = busy_and_gaps(device, min_gap, max_gap)
    span = device[-1].end - device[0].start
    idle = sum(g.length for g in gaps)
    lines = [
        f"{path.name}: device span {span / 1000:.2f} ms, busy {busy / 1000:.2f} ms "
        f"({100 * busy / span:.0f}%), {len(device)} device events, "
        f"{len(gaps)} gaps of {min_gap:g}-{max_gap:g} us totalling {idle / 1000:.2f} ms",
        "| gap us | at ms | device before -> after | host ops during the gap |",
        "| ---: | ---: | --- | --- |",
    ]
    for gap in sorted(gaps, key=lambda g: -g.length)[:top]:
        at = (gap.start - device[0].start) / 1000
        lines.append(f"| {gap.length:.0f} | {at:.2f} | {gap.before[:40]} -> {gap.after[:40]} | "
                     f"{' / '.join(host_ops_during(host, gap))} |")
    if by_op:
        lines += ["", "| ms idle | host op (summed over the gaps) |", "| ---: | --- |"]
        lines += idle_by_op(host, gaps, 3 * top)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--min-gap-us", type=float, default=10.0)
    parser.add_argument("--max-gap-us", type=float, default=float("inf"),
                        help="leave out longer gaps (an engine idle between units)")
    parser.add_argument("--by-op", action="store_true",
                        help="also rank host ops by their time inside all the gaps")
    args = parser.parse_args()
    print(report(args.trace, args.top, args.min_gap_us, args.max_gap_us, args.by_op))


if __name__ == "__main__":
    main()
