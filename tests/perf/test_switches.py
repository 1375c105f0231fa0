"""perf/switches.py: a result file names the MINICPMO_* switches its run was under (A/B runs
differ only there), and the duplex report prints them with the run's other facts."""
from __future__ import annotations

from perf.bench_report import render_markdown
from perf.switches import active_switches


def test_only_the_project_switches_sorted() -> None:
    environ = {"MINICPMO_PDL": "0", "PATH": "/bin", "MINICPMO_MPS_LOW_PRIORITY": "code2wav", "CUDA_VISIBLE_DEVICES": "0"}
    assert active_switches(environ) == "MINICPMO_MPS_LOW_PRIORITY=code2wav, MINICPMO_PDL=0"


def test_no_switch_says_defaults() -> None:
    assert active_switches({"PATH": "/bin"}) == "none (defaults)"


def test_duplex_report_prints_the_switches() -> None:
    meta = {"command": "python -m perf.duplex_bench", "commit": "abc", "switches": "MINICPMO_PDL=0"}
    assert "- switches: MINICPMO_PDL=0" in render_markdown("Bench", meta, [])
