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


CALLS_BEFORE = """minicpmo_stage_call_ms_bucket{model="duplex",stage="talker",le="20.0"} 1
minicpmo_stage_call_ms_bucket{model="duplex",stage="talker",le="50.0"} 2
minicpmo_stage_call_ms_bucket{model="duplex",stage="talker",le="+Inf"} 2
minicpmo_stage_call_ms_sum{model="duplex",stage="talker"} 50
minicpmo_stage_call_ms_count{model="duplex",stage="talker"} 2
minicpmo_stage_call_ms_bucket{model="duplex",stage="code2wav",le="20.0"} 0
minicpmo_stage_call_ms_bucket{model="duplex",stage="code2wav",le="50.0"} 0
minicpmo_stage_call_ms_bucket{model="duplex",stage="code2wav",le="+Inf"} 0
minicpmo_stage_call_ms_sum{model="duplex",stage="code2wav"} 0
minicpmo_stage_call_ms_count{model="duplex",stage="code2wav"} 0
"""


def test_stage_labels_split_a_family_and_buckets_bound_its_p99():
    """In the level: talker 100 calls, 98 under 20 ms, 2 in (20, 50] (P99 under 50); code2wav
    10 calls, one beyond the last finite bucket (P99 beyond it)."""
    after = CALLS_BEFORE
    for old, new in (('talker",le="20.0"} 1', 'talker",le="20.0"} 99'), ('talker",le="50.0"} 2', 'talker",le="50.0"} 102'),
                     ('talker",le="+Inf"} 2', 'talker",le="+Inf"} 102'), ('_sum{model="duplex",stage="talker"} 50', '_sum{model="duplex",stage="talker"} 1550'),
                     ('_count{model="duplex",stage="talker"} 2', '_count{model="duplex",stage="talker"} 102'),
                     ('code2wav",le="20.0"} 0', 'code2wav",le="20.0"} 5'), ('code2wav",le="50.0"} 0', 'code2wav",le="50.0"} 9'),
                     ('code2wav",le="+Inf"} 0', 'code2wav",le="+Inf"} 10'),
                     ('_sum{model="duplex",stage="code2wav"} 0', '_sum{model="duplex",stage="code2wav"} 900'),
                     ('_count{model="duplex",stage="code2wav"} 0', '_count{model="duplex",stage="code2wav"} 10')):
        after = after.replace(old, new)
    series = {s.model: s for s in server_series(parse_samples(CALLS_BEFORE), parse_samples(after))}
    assert sorted(series) == ["duplex/code2wav", "duplex/talker"]
    talker, code2wav = series["duplex/talker"], series["duplex/code2wav"]
    assert (talker.observations, talker.mean, talker.p99_bound) == (100, pytest.approx(15.0), 50.0)
    assert (code2wav.observations, code2wav.mean, code2wav.p99_bound) == (10, pytest.approx(90.0), float("inf"))
    plain = server_series(parse_samples(BEFORE), parse_samples(AFTER))[0]
    assert plain.model == "thinker" and plain.p99_bound is None  # no bucket moved in BEFORE/AFTER: none seen


def test_window_wait_kinds_are_separate_series():
    before = """minicpmo_code2wav_window_wait_ms_sum{model="code2wav",kind="first"} 0
minicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="first"} 0
minicpmo_code2wav_window_wait_ms_sum{model="code2wav",kind="later"} 0
minicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="later"} 0
"""
    after = (before.replace('first"} 0\nminicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="first"} 0',
                            'first"} 30\nminicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="first"} 3')
             .replace('later"} 0\nminicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="later"} 0',
                      'later"} 200\nminicpmo_code2wav_window_wait_ms_count{model="code2wav",kind="later"} 4'))
    series = {s.model: s for s in server_series(parse_samples(before), parse_samples(after))}
    assert sorted(series) == ["code2wav/first", "code2wav/later"]
    assert (series["code2wav/first"].observations, series["code2wav/first"].mean) == (3, pytest.approx(10.0))
    assert (series["code2wav/later"].observations, series["code2wav/later"].mean) == (4, pytest.approx(50.0))
