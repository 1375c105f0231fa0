"""The soak's record: TTFP drift, the verdict behind the exit status, and the results page
(JSON with every window, markdown with the summary table, PNG plot)."""
from __future__ import annotations

import argparse
import json

import pytest

from perf.soak import SoakConfig, Tally, Worker, page_title, session_headroom
from perf.soak_report import (ALL_WINDOWS, QUIET_WINDOWS, ServerHealth, SoakResult, Window, render_markdown,
                              ttfp_drift, write_results)

META = {"command": "python -m perf.soak --minutes 3", "commit": "abc123", "profile": "cpu", "minutes": 3,
        "device": "CPU: Intel(R) Xeon(R) Processor (2 cores), Linux", "workload": "4 sessions", "started": "now"}


def _window(t_s: float, p50: float | None, rss: float | None = 900.0, neighbour: bool = False, **counts: int) -> Window:
    return Window(t_s, counts.get("sessions", 0), counts.get("turns", 0), counts.get("barge_ins", 0),
                  counts.get("drops", 0), counts.get("errors", 0), p50, None if p50 is None else p50 * 1.5, rss,
                  4, 0, 100, neighbour, {"sessions.duplex": 1.0})


def _result(**overrides) -> SoakResult:
    windows = [_window(0, None, 800.0), _window(60, 100.0, 850.0, sessions=3, turns=9),
               _window(120, 110.0, 860.0, neighbour=True, sessions=6, turns=20, drops=1),
               _window(180, 104.0, 870.0, sessions=9, turns=30, barge_ins=4, drops=2)]
    fields = {"sessions": 9, "turns": 30, "barge_ins": 4, "drops": 2,
              "server": ServerHealth(watched=True, kernel_log_read=False), "neighbour": {"cycles": 2, "failures": []},
              **overrides}
    return SoakResult(dict(META), windows, **fields)


def test_drift_compares_the_first_and_last_window_with_a_ttfp():
    drift = ttfp_drift([_window(0, None), _window(60, 100.0), _window(120, 120.0), _window(180, 110.0)])
    assert (drift.first_ms, drift.last_ms, drift.windows, drift.basis) == (100.0, 110.0, 3, ALL_WINDOWS)
    assert drift.pct == pytest.approx(10.0)
    assert drift.slope_ms_per_min == pytest.approx(5.0)  # least squares through (1,100) (2,120) (3,110)


def test_drift_leaves_out_windows_in_which_the_neighbour_ran():
    windows = [_window(60, 100.0), _window(120, 300.0, neighbour=True), _window(180, 95.0)]
    drift = ttfp_drift(windows)
    assert (drift.first_ms, drift.last_ms, drift.basis) == (100.0, 95.0, QUIET_WINDOWS)
    assert drift.pct == pytest.approx(-5.0)


def test_drift_over_all_windows_when_too_few_are_quiet():
    drift = ttfp_drift([_window(60, 100.0), _window(120, 300.0, neighbour=True), _window(180, 200.0, neighbour=True)])
    assert (drift.first_ms, drift.last_ms, drift.basis) == (100.0, 200.0, ALL_WINDOWS)


def test_no_drift_without_two_windows_with_a_ttfp():
    assert ttfp_drift([_window(0, None), _window(60, 100.0)]) is None


def test_a_clean_soak_passes():
    assert _result().problems() == []


@pytest.mark.parametrize("overrides, word", [
    ({"errors": {"turn_timeout": 1}}, "errors"),
    ({"server": ServerHealth(watched=True, restart_reasons=("was killed by SIGSEGV",), ready_again=1)}, "deaths"),
    ({"server": ServerHealth(watched=True, stub_restarts=1)}, "stub restarts"),
    ({"server": ServerHealth(watched=True, segfaults=("triton_python_b[7]: segfault at 0",))}, "segfaults"),
    ({"server": ServerHealth(watched=True, launcher_exit=1)}, "launcher exited"),
    ({"neighbour": {"cycles": 1, "failures": ["start: timeout"]}}, "neighbour"),
    ({"held_at_end": {"sessions.duplex": 1.0}}, "held"),
    ({"pauses": {"pauses": 3, "by_model": {"thinker": 3}, "failures": ["stub 7 (thinker) was gone"]}}, "pause"),
])
def test_every_kind_of_trouble_fails_the_soak(overrides, word):
    problems = _result(**overrides).problems()
    assert len(problems) == 1 and word in problems[0]


def test_the_page_counts_the_stub_pauses_by_model():
    page = render_markdown("Soak", _result(pauses={"pauses": 5, "by_model": {"duplex": 2, "thinker": 3},
                                                   "failures": []}), None)
    assert "| stub pauses, SIGSTOP then SIGCONT (failures) | 5 (0): duplex 2, thinker 3 |" in page
    assert "stub pauses" not in render_markdown("Soak", _result(), None)


def test_the_page_has_the_command_commit_device_and_summary():
    page = render_markdown("Soak, cpu profile", _result(errors={"turn_timeout": 2}), "soak_test.png")
    for text in (META["command"], "- commit: abc123", META["device"], "| duration | 3.0 min |",
                 "| client drops (no END, stream cancelled) | 2 |", "| errors | 2 (turn_timeout: 2) |",
                 "| server deaths / restarts | 0 / 0 |", "| neighbour cycles (failures) | 2 (0) |",
                 "100 / 104 ms, drift +4.0 %", "800 / 870 / 870 MiB (growth +70 MiB)",
                 "[soak_test.png](soak_test.png)", "verdict: fail: 2 errors"):
        assert text in page, text
    assert page.count("\n| 3.0 | 9 | 30 | 4 | 2 | 0 | 104 / 156 | 870 | - | 4 | 0 | no |") == 1
    assert "| GPU peak allocated (stages summed) first / last / max | not published (no GPU stage) |" in page


def test_the_page_follows_the_gpu_stages_summed_peak():
    result = _result()
    for window, peak in zip(result.windows, (900.0, 1000.0, 1100.0, 1050.0)):
        window.held.update({"cuda_peak_allocated_mib.thinker": peak, "cuda_peak_allocated_mib.talker": 100.0})
    page = render_markdown("Soak", result, None)
    assert "| 1000 / 1150 / 1200 MiB (growth +150 MiB) |" in page
    assert "\n| 3.0 | 9 | 30 | 4 | 2 | 0 | 104 / 156 | 870 | 1150 | 4 | 0 | no |" in page


def test_a_long_series_is_sampled_on_the_page_but_whole_in_the_json(tmp_path):
    windows = [_window(15.0 * i, 100.0 + i % 3) for i in range(241)]
    result = SoakResult(dict(META), windows)
    page = render_markdown("t", result, None)
    rows = [line for line in page.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert 20 <= len(rows) <= 31 and rows[-1].startswith("| 60.0 |")
    write_results(tmp_path, "soak_x", "t", result)
    assert len(json.loads((tmp_path / "soak_x.json").read_text())["windows"]) == 241


def test_write_results_writes_json_page_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    written = write_results(tmp_path / "out", "soak_test", "Soak, cpu profile", _result())
    assert [path.name for path in written] == ["soak_test.json", "soak_test.md", "soak_test.png"]
    assert (tmp_path / "out" / "soak_test.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "out" / "soak_test.json").read_text())
    assert record["commit"] == "abc123" and record["drops"] == 2 and record["problems"] == []
    assert record["server"]["deaths"] == 0 and record["neighbour"]["cycles"] == 2
    assert record["ttfp_drift"]["pct"] == pytest.approx(4.0)
    assert [w["t_s"] for w in record["windows"]] == [0, 60, 120, 180]
    assert record["windows"][2]["neighbour_ran"] is True


def test_the_plot_title_names_the_device_and_profile():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from perf.soak_plot import build_figure

    fig = build_figure("Soak", META, _result().windows)
    assert "Intel(R) Xeon(R) Processor (2 cores)" in fig._suptitle.get_text()
    assert "profile: cpu" in fig._suptitle.get_text()
    plt.close(fig)


def test_the_memory_panel_sums_the_gpu_stages_gauges_where_they_are_published():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from perf.soak_plot import build_figure

    windows = _result().windows
    for window, peak in zip(windows[1:], (1000.0, 1100.0, 1100.0)):
        window.held.update({"cuda_peak_allocated_mib.thinker": peak, "cuda_peak_allocated_mib.code2wav": 200.0})
    fig = build_figure("Soak", META, windows)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    peak = lines["GPU peak allocated (stages, summed)"]
    assert list(peak.get_ydata()) == [1200.0, 1300.0, 1300.0]  # the first window had no gauge
    assert "GPU reserved (stages, summed)" not in lines  # nobody published it: no line
    plt.close(fig)


def _config(drop: float) -> SoakConfig:
    return SoakConfig("127.0.0.1:1", sessions=2, minutes=1, barge_in=0.0, turns=4, reply_units=4, seed=3, drop=drop)


def test_drop_points_fall_inside_the_session_with_the_asked_probability():
    worker = Worker(_config(0.3), Tally(), 0, deadline=0.0)
    points = [worker.drop_point() for _ in range(2000)]
    dropped = [p for p in points if p is not None]
    assert 0.25 < len(dropped) / len(points) < 0.35
    assert {turn for turn, _ in dropped} == {0, 1, 2, 3}
    assert min(a for _, a in dropped) >= 1 and max(a for _, a in dropped) <= 20
    assert all(Worker(_config(0.0), Tally(), 1, 0.0).drop_point() is None for _ in range(100))


def test_a_drop_probability_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        _config(1.5)


def _args(**kw) -> argparse.Namespace:
    base = {"profile": "cpu", "sessions": 4, "minutes": 60.0, "barge_in": 0.4, "drop": 0.3, "neighbour_every_s": 180,
            "pause_stubs_every_s": None}
    return argparse.Namespace(**{**base, **kw})


def test_dropped_sessions_get_room_until_the_server_reaps_them():
    assert session_headroom(_args()) == ["max_sessions=8"]
    assert session_headroom(_args(drop=0.0)) == ["max_sessions=4"]
    assert session_headroom(_args(sessions=1, drop=0.0)) == ["max_sessions=4"]  # the profile's own


def test_the_title_names_what_the_soak_did():
    assert page_title(_args()) == ("Soak, cpu profile: 4 sessions for 60 min with barge-ins, client drops "
                                   "and a neighbour server")
    assert page_title(_args(drop=0.0, neighbour_every_s=None)) == "Soak, cpu profile: 4 sessions for 60 min with barge-ins"
    assert page_title(_args(barge_in=0.0, drop=0.0, neighbour_every_s=None)) == "Soak, cpu profile: 4 sessions for 60 min"
    assert page_title(_args(drop=0.0, neighbour_every_s=None, pause_stubs_every_s=30)) == \
        "Soak, cpu profile: 4 sessions for 60 min with barge-ins and stub pauses"
