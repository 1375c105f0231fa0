"""perf/bench_spread.py: per-C spread of server TTFP over runs of the same code."""
from __future__ import annotations

import json

import pytest

from perf.bench_spread import load_levels, main, render, spread


def _report(path, levels):
    """levels: {C: (ttfp mean, ttfp p99, rtf median, underrun turns)}; a None mean: no TTFP."""
    def summary(c, values):
        mean, p99, rtf, underruns = values
        ttfp = {} if mean is None else {"mean": mean, "p99": p99}
        return {"summary": {"concurrency": c, "turns_with_underrun": underruns,
                            "metrics": {"server_ttfp_ms": ttfp, "rtf": {"median": rtf}}}}
    path.write_text(json.dumps({"levels": [summary(c, v) for c, v in levels.items()]}))
    return path


def test_levels_every_run_measured_give_each_runs_values_and_the_range(tmp_path):
    a = _report(tmp_path / "a.json", {1: (90.0, 95.0, 0.6, 0), 16: (140.0, 190.0, 0.62, 2), 32: (200.0, 260.0, 0.63, 9)})
    b = _report(tmp_path / "b.json", {16: (126.0, 170.0, 0.61, 1), 32: (180.0, 250.0, 0.63, 4)})
    rows = spread([load_levels(a), load_levels(b)])
    assert [r.concurrency for r in rows] == [16, 32]  # C = 1 is only in run a
    assert rows[0].ttfp_means == (140.0, 126.0) and rows[0].ttfp_range == 14.0
    assert rows[1].underrun_turns == (9, 4) and rows[1].rtf_medians == (0.63, 0.63)
    table = render(rows, ["a", "b"])
    assert "| 16 | 140 / 126 | 126 / 133 / 140 | 14 | 190 / 170 | 0.62 / 0.61 | 2 / 1 |" in table


def test_a_level_without_ttfp_is_left_out_and_no_runs_is_an_error(tmp_path):
    a = _report(tmp_path / "a.json", {4: (None, None, 0.6, 0), 8: (100.0, 120.0, 0.6, 0)})
    assert [r.concurrency for r in spread([load_levels(a)])] == [8]
    with pytest.raises(ValueError):
        spread([])


def test_the_command_prints_the_table(tmp_path, capsys):
    a = _report(tmp_path / "a.json", {8: (100.0, 120.0, 0.6, 0)})
    b = _report(tmp_path / "b.json", {8: (110.0, 130.0, 0.61, 1)})
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Runs: a, b") and "| 8 | 100 / 110 | 100 / 105 / 110 | 10 |" in out
