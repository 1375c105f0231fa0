"""perf/switches.py: a result file names the MINICPMO_* variables its run was under (a run with
the stage-call diagnostics differs there), and the duplex report prints them with the run's
other details."""
from __future__ import annotations

from perf.bench_report import render_markdown
from perf.switches import active_switches


def test_only_the_project_variables_sorted() -> None:
    environ = {"MINICPMO_STAGE_CALL_METRICS": "1", "PATH": "/bin", "MINICPMO_HOME": "/data",
               "CUDA_VISIBLE_DEVICES": "0"}
    assert active_switches(environ) == "MINICPMO_HOME=/data, MINICPMO_STAGE_CALL_METRICS=1"


def test_no_variable_says_defaults() -> None:
    assert active_switches({"PATH": "/bin"}) == "none (defaults)"


def test_duplex_report_prints_the_variables() -> None:
    meta = {"command": "python -m perf.duplex_bench", "commit": "abc", "switches": "MINICPMO_STAGE_CALL_METRICS=1"}
    assert "- switches: MINICPMO_STAGE_CALL_METRICS=1" in render_markdown("Bench", meta, [])
