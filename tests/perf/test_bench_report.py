"""perf/bench_report.py and perf/bench_plot.py: the markdown tables carry our numbers next to
the reference, the JSON keeps every turn, and the plot is a PNG."""
from __future__ import annotations

import json

import pytest

from perf.bench_merge import merge
from perf.bench_plot import plot_levels
from perf.bench_report import REFERENCE, render_markdown, write_json
from perf.bench_stats import summarize
from perf.duplex_levels import LevelResult
from perf.stage_breakdown import ServerSeries, estimate_units

META = {"command": "python -m perf.duplex_bench", "commit": "abc", "device": "cpu"}


@pytest.fixture
def levels(record_factory):
    out = []
    for concurrency in (1, 2):
        groups = [[record_factory(g, t, server_ttfp_ms=100.0 * concurrency) for t in range(2)] for g in range(2)]
        records = [r for group in groups for r in group]
        out.append(LevelResult(summarize(concurrency, groups, 10.0), estimate_units(records, 200),
                               [ServerSeries("minicpmo_stage_step_ms", "thinker", 4, 40.0, 10.0, 20.0),
                                ServerSeries("minicpmo_stage_call_ms", "duplex/talker", 2, 9.0, 4.5, float("inf")),
                                ServerSeries("minicpmo_stage_call_ms", "duplex/code2wav", 1, 3.0, 3.0)],
                               None, None, groups))
    return [level.to_json() for level in out]


def test_markdown_has_one_row_per_level_and_the_reference(levels):
    text = render_markdown("Bench", META, levels)
    assert "| 1 | 2 (0) | 4 (0, 0) | 0 |" in text and "| 2 | 2 (0) | 4 (0, 0) | 0 |" in text
    assert f"{REFERENCE[1][0][0]} -> {REFERENCE[1][0][1]}" in text
    assert "| 2 | 200 / 775 -> 726 |" in text  # our server TTFP next to the reference
    assert "| 1 | minicpmo_stage_step_ms | thinker | 4 | 10 | 20 |" in text
    assert "| 2 | minicpmo_stage_call_ms | duplex/talker | 2 | 4.5 | > last bucket |" in text
    assert "| 2 | minicpmo_stage_call_ms | duplex/code2wav | 1 | 3 | - |" in text  # an old file: no bound


def test_an_older_json_without_p99_bounds_still_renders(levels):
    for level in levels:
        for series in level["server_metrics"]:
            series.pop("p99_bound", None)
    assert "| 1 | minicpmo_stage_step_ms | thinker | 4 | 10 | - |" in render_markdown("Bench", META, levels)


def test_json_keeps_every_turn(levels, tmp_path):
    write_json(tmp_path / "run.json", META, levels)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["commit"] == "abc"
    assert [len(level["turns"]) for level in data["levels"]] == [4, 4]
    assert data["levels"][1]["summary"]["metrics"]["server_ttfp_ms"]["mean"] == pytest.approx(200.0)


def test_plot_is_a_png(levels, tmp_path):
    pytest.importorskip("matplotlib")
    assert plot_levels(tmp_path / "plot.png", "Bench", levels)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parts_merge_by_concurrency(levels, tmp_path):
    first = {**META, "commit": "a", "levels": levels[1:]}
    second = {**META, "commit": "b", "levels": levels[:1]}
    meta, merged = merge([first, second])
    assert [level["summary"]["concurrency"] for level in merged] == [1, 2]
    assert meta["commit"] == "a | b" and meta["device"] == "cpu"
    with pytest.raises(ValueError):
        merge([])
