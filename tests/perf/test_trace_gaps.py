"""perf/trace_gaps.py on a hand-made Chrome trace.

Strategy: a trace with known device intervals (overlapping, touching and apart) and host ops
around the gaps; busy time, the gaps kept by the size bounds, the host ops named inside each
gap and the summed ranking are checked against hand-computed values.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from perf.trace_gaps import busy_and_gaps, host_ops_during, idle_by_op, load_events, report, spans

DEVICE = [("k1", 0, 10), ("k2", 5, 20), ("copy", 20, 25), ("k3", 100, 110), ("k4", 5000, 5010)]
HOST = [("step", 20, 5000), ("aten::stft", 30, 80), ("cudaGraphLaunch", 85, 99)]


def _trace() -> list[dict]:
    cats = {"copy": "gpu_memcpy"}
    events = [{"ph": "X", "cat": cats.get(n, "kernel"), "name": n, "ts": a, "dur": b - a}
              for n, a, b in DEVICE]
    events += [{"ph": "X", "cat": "cuda_runtime" if n.startswith("cuda") else "cpu_op",
                "name": n, "ts": a, "dur": b - a} for n, a, b in HOST]
    return events + [{"ph": "i", "name": "marker", "ts": 3}]  # not a span: ignored


def test_busy_time_is_the_union_and_gaps_respect_their_bounds() -> None:
    device = spans(_trace(), {"kernel", "gpu_memcpy"})
    busy, gaps = busy_and_gaps(device, min_gap=10)
    assert busy == 25 + 10 + 10  # [0, 25) merged from three, then two kernels of 10
    assert [(g.start, g.end, g.before, g.after) for g in gaps] == [
        (25, 100, "copy", "k3"), (110, 5000, "k3", "k4")]
    _, short = busy_and_gaps(device, min_gap=10, max_gap=1000)
    assert [g.length for g in short] == [75]  # the engine-idle gap is left out


def test_host_ops_inside_a_gap_and_summed_over_gaps() -> None:
    events = _trace()
    host = spans(events, {"cpu_op", "cuda_runtime"})
    _, gaps = busy_and_gaps(spans(events, {"kernel", "gpu_memcpy"}), 10, 1000)
    assert host_ops_during(host, gaps[0]) == ["step 75", "aten::stft 50", "cudaGraphLaunch 14"]
    assert idle_by_op(host, gaps, 2) == ["| 0.07 | step |", "| 0.05 | aten::stft |"]


def test_report_reads_plain_and_gzipped_traces(tmp_path: Path) -> None:
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps({"traceEvents": _trace()}))
    with gzip.open(packed, "wt") as handle:
        json.dump(_trace(), handle)  # a bare event list is accepted too
    assert load_events(plain) == load_events(packed)
    text = report(packed, top=5, min_gap=10, max_gap=1000, by_op=True)
    assert "busy 0.04 ms" in text and "1 gaps of 10-1000 us totalling 0.07 ms" in text
    assert "| 75 | 0.03 | copy -> k3 | step 75 / aten::stft 50 / cudaGraphLaunch 14 |" in text
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    assert "no device events" in report(empty, 5, 10)
