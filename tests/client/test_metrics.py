"""Tests for client/metrics.py.

Strategy: synthetic timelines whose times and chunk lengths are binary fractions of a second
(0.25 s = 6000 samples at 24 kHz), so every expected value below is worked out by hand from
the definitions in docs/metrics.md#latency-of-a-turn and compared exactly up to float rounding.
"""

import json

import pytest

from client.metrics import (
    ChunkArrival,
    SessionReport,
    TurnTimeline,
    compute_turn_metrics,
    simulate_playback,
)

# Differences of exact binary fractions plus the 0.2 s buffer: only rounding error remains.
FLOAT_REL = 1e-9
QUARTER_S = 6000  # samples at 24 kHz


def chunk(received_s: float, quarters: int) -> ChunkArrival:
    return ChunkArrival(received_s, quarters * QUARTER_S)


def timeline(chunks, *, start_s=10.0, first_text_s=None, server_ttfp_ms=None) -> TurnTimeline:
    return TurnTimeline(
        response_id="r1", turn_start_s=start_s, status="completed", first_text_s=first_text_s,
        server_ttft_ms=12.5, server_ttfp_ms=server_ttfp_ms, chunks=tuple(chunks),
    )


def test_steady_turn_has_exact_latencies_and_no_stall():
    chunks = [chunk(10.5, 2), chunk(11.0, 2), chunk(11.5, 2)]  # 3 x 0.5 s, one per 0.5 s
    metrics = compute_turn_metrics(
        timeline(chunks, first_text_s=10.25, server_ttfp_ms=321.0), turn_index=4
    )
    assert metrics.turn_index == 4 and metrics.response_id == "r1"
    assert metrics.client_ttft_ms == pytest.approx(250.0, rel=FLOAT_REL)
    assert metrics.client_ttfp_ms == pytest.approx(500.0, rel=FLOAT_REL)
    assert (metrics.server_ttft_ms, metrics.server_ttfp_ms) == (12.5, 321.0)
    # (11.5 - 10.0) s to deliver 1.5 s of audio.
    assert metrics.rtf == pytest.approx(1.0, rel=FLOAT_REL)
    assert metrics.audio_ms == pytest.approx(1500.0, rel=FLOAT_REL)
    assert metrics.num_chunks == 3
    assert metrics.inter_chunk_gaps_ms == pytest.approx((500.0, 500.0), rel=FLOAT_REL)
    assert metrics.max_inter_chunk_gap_ms == pytest.approx(500.0, rel=FLOAT_REL)
    assert metrics.playback_stalls_ms == ()
    assert (metrics.num_underruns, metrics.underrun_ms) == (0, 0.0)


def test_stalls_and_underruns_with_200ms_buffer():
    # Player: starts at 0.2, runs dry at 0.45; chunk 2 at 0.5 -> 50 ms stall (audible? no);
    # runs dry at 0.75; chunk 3 at 1.25 -> 500 ms stall (underrun); runs dry at 1.75 exactly
    # when chunk 4 arrives -> no stall (a gap needs the arrival to be strictly later).
    chunks = (chunk(0.0, 1), chunk(0.5, 1), chunk(1.25, 2), chunk(1.75, 1))
    stats = simulate_playback(chunks)
    assert stats.stalls_ms == pytest.approx((50.0, 500.0), rel=FLOAT_REL)
    assert stats.num_underruns == 1
    assert stats.underrun_ms == pytest.approx(500.0, rel=FLOAT_REL)


def test_underrun_threshold_is_strict():
    # 250 ms buffer: dry at 0.5; chunk 2 at 0.625 -> exactly a 125 ms stall.
    chunks = (chunk(0.0, 1), chunk(0.625, 1))
    at_threshold = simulate_playback(chunks, buffer_ms=250.0, underrun_gap_ms=125.0)
    below_threshold = simulate_playback(chunks, buffer_ms=250.0, underrun_gap_ms=124.0)
    assert at_threshold.stalls_ms == (125.0,)
    assert at_threshold.num_underruns == 0
    assert (below_threshold.num_underruns, below_threshold.underrun_ms) == (1, 125.0)


def test_playback_resumes_on_arrival_after_a_stall():
    """A player that re-buffered or kept the old schedule would count a second stall here."""
    # dry at 0.45; chunk 2 at 1.0 (550 ms stall) plays 1.0-1.5; chunk 3 at 1.5 is on time.
    stats = simulate_playback((chunk(0.0, 1), chunk(1.0, 2), chunk(1.5, 1)))
    assert stats.stalls_ms == pytest.approx((550.0,), rel=FLOAT_REL)


def test_turn_without_audio():
    metrics = compute_turn_metrics(timeline([]), turn_index=0)
    assert metrics.client_ttfp_ms is None and metrics.client_ttft_ms is None
    assert metrics.rtf is None and metrics.max_inter_chunk_gap_ms is None
    assert (metrics.audio_ms, metrics.num_chunks, metrics.inter_chunk_gaps_ms) == (0.0, 0, ())


def report(turns, errors=(), reply_audio_ms=1000.0) -> SessionReport:
    return SessionReport(
        "s1", tuple(turns), tuple(errors), 2000.0, 400.0, reply_audio_ms, 3.0, True
    )


def test_session_mean_rtf_skips_turns_without_audio():
    turns = [
        compute_turn_metrics(timeline([chunk(10.5, 2)]), 0),  # rtf 0.5 s / 0.5 s = 1.0
        compute_turn_metrics(timeline([chunk(10.25, 4)]), 1),  # rtf 0.25 s / 1 s = 0.25
        compute_turn_metrics(timeline([]), 2),
    ]
    assert report(turns).mean_rtf == pytest.approx(0.625, rel=FLOAT_REL)
    assert report([]).mean_rtf is None


def test_report_json_round_trip_and_ok():
    turns = [compute_turn_metrics(timeline([chunk(10.5, 2)]), 0)]
    loaded = json.loads(report(turns).to_json())
    assert loaded["session_id"] == "s1" and loaded["ok"] is True
    assert loaded["turns"][0]["client_ttfp_ms"] == pytest.approx(500.0, rel=FLOAT_REL)
    assert loaded["mean_rtf"] == pytest.approx(1.0, rel=FLOAT_REL)
    assert report(turns, errors=["error event X: y"]).ok is False
    assert report(turns, reply_audio_ms=0.0).ok is False
