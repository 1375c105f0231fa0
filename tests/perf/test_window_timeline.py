"""perf/window_timeline.py on CPU with the tiny model: every graphed part of a window is timed
in call order inside the window's wall time, the wrappers are gone afterwards, and the report
has a line per column (device columns need CUDA)."""

from __future__ import annotations

import time

import torch

from perf.window_timeline import PARTS, build, report, time_windows


def test_a_window_is_timed_part_by_part_in_order() -> None:
    originals = {name: cls.__call__ for name, cls in PARTS.items()}
    with torch.inference_mode():
        model, streams = build(tiny=True, device=torch.device("cpu"), batch=2)
        rows = time_windows(model, streams, windows=2)
    assert {name: cls.__call__ for name, cls in PARTS.items()} == originals
    assert len(rows) == 2
    for row in rows:
        order = [row[f"{part} host {edge}"] for part in ("encoder", "cfm", "hift") for edge in ("in", "out")]
        assert order == sorted(order) and 0.0 < order[0] and order[-1] <= row["wall"]
        assert not any("device" in column for column in row)  # CPU: host columns only
    lines = report(2, rows)
    assert lines[0].startswith("### batch 2 (2 windows") and len(lines) == 4 + len(rows[0]) + 1


def test_idle_windows_start_after_the_pause_and_say_so() -> None:
    with torch.inference_mode():
        model, streams = build(tiny=True, device=torch.device("cpu"), batch=1)
        time_windows(model, streams, windows=1)  # warm: the timed call below is one pause + windows
        start = time.perf_counter()
        rows = time_windows(model, streams, windows=2, idle_s=0.3)
        elapsed = time.perf_counter() - start
    assert elapsed >= 0.6  # each timed window paused first
    assert all(row["encoder host in"] < 300.0 for row in rows)  # the pause is not in a window's time
    assert report(1, rows, idle_s=0.3)[0] == "### batch 1 (2 windows, each after 0.3 s idle, ms from the window's start)"
