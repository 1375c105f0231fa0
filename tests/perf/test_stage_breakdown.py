"""perf/stage_breakdown.py: server histogram deltas from Prometheus text, and the per-unit
estimate from event timestamps, both checked on hand-made inputs."""
from __future__ import annotations

import pytest

from perf.stage_breakdown import estimate_units, parse_samples, server_series, step_time_per_unit
from perf.turn import UnitEvent

EXACT = 1e-6

BEFORE = """# HELP minicpmo_stage_step_ms step time
minicpmo_stage_step_ms_bucket{model="thinker",le="10"} 3
minicpmo_stage_step_ms_sum{model="thinker"} 30
minicpmo_stage_step_ms_count{model="thinker"} 3
minicpmo_stage_step_ms_sum{model="talker"} 5
minicpmo_stage_step_ms_count{model="talker"} 5
minicpmo_sessions{model="duplex"} 1
nv_inference_count{model="duplex",version="1"} 9
"""
AFTER = BEFORE.replace('_sum{model="thinker"} 30', '_sum{model="thinker"} 90').replace(
    '_count{model="thinker"} 3', '_count{model="thinker"} 13')


def test_parse_keeps_only_our_series():
    samples = parse_samples(BEFORE)
    assert samples['minicpmo_stage_step_ms_sum{model="thinker"}'] == 30.0
    assert not any(key.startswith("nv_") for key in samples)


def test_series_report_the_mean_of_what_was_observed_in_between():
    series = server_series(parse_samples(BEFORE), parse_samples(AFTER))
    assert [(s.family, s.model) for s in series] == [("minicpmo_stage_step_ms", "thinker")]  # talker idle
    assert series[0].observations == 10
    assert series[0].total == pytest.approx(60.0, abs=EXACT)
    assert series[0].mean == pytest.approx(6.0, abs=EXACT)


def test_unit_estimate_from_event_times(record_factory):
    # 200 ms appends at 0.0, 0.2, ...: unit 0 is complete at the append sent at 0.8 s, unit 1 at 1.8 s
    events = (UnitEvent("text", 0, 0.85, "hi"), UnitEvent("audio", None, 1.05, "hi"),
              UnitEvent("decision", 1, 1.83))
    record = record_factory(appends=10, events=events)
    estimate = estimate_units([record], append_ms=200)
    assert (estimate.decided_units, estimate.speak_units) == (2, 1)
    assert estimate.first_thinker_ms.mean == pytest.approx(50.0, abs=1e-6)
    assert estimate.thinker_ms.mean == pytest.approx(30.0, abs=1e-6)
    assert estimate.tail_ms.mean == pytest.approx(200.0, abs=1e-6)
    series = server_series(parse_samples(BEFORE), parse_samples(AFTER))
    cost = step_time_per_unit(series, estimate.decided_units, estimate.speak_units)
    assert cost == {"thinker": pytest.approx(30.0, abs=EXACT)}  # 60 ms of steps over 2 decided units


def test_scrape_sums_the_pages_of_replicas(monkeypatch):
    import perf.stage_breakdown as breakdown

    pages = {"http://a/metrics": BEFORE, "http://b/metrics": AFTER}
    monkeypatch.setattr(breakdown, "_scrape_one", lambda url, timeout_s: parse_samples(pages[url]))
    total = breakdown.scrape("http://a/metrics, http://b/metrics")
    assert total['minicpmo_stage_step_ms_sum{model="thinker"}'] == pytest.approx(120.0, abs=EXACT)
    assert total['minicpmo_stage_step_ms_count{model="talker"}'] == pytest.approx(10.0, abs=EXACT)
