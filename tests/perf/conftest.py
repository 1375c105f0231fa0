"""Synthetic benchmark records for the perf unit tests: turns built from hand-made timelines,
so the statistics can be checked against numbers computed by hand."""
from __future__ import annotations

import pytest

from client.metrics import ChunkArrival, SessionReport, TurnTimeline, compute_turn_metrics
from perf.turn import TurnRecord, UnitEvent
from perf.workload import TurnSpec

CHUNK_SAMPLES = 24000  # one second of 24 kHz audio per chunk


def make_record(group: int = 0, turn: int = 0, *, ttfp_s: float = 1.2, chunks: int = 3, server_ttfp_ms: float | None = 200.0,
                errors: tuple[str, ...] = (), appends: int = 10, events: tuple[UnitEvent, ...] = ()) -> TurnRecord:
    """A turn whose first append is at t=0, first chunk at `ttfp_s`, then one chunk per second."""
    arrivals = tuple(ChunkArrival(ttfp_s + k, CHUNK_SAMPLES) for k in range(chunks))
    timeline = TurnTimeline("resp-1", 0.0, "completed" if chunks else None, ttfp_s - 0.1 if chunks else None,
                            50.0 if chunks else None, server_ttfp_ms if chunks else None, arrivals)
    metrics = (compute_turn_metrics(timeline, 0),) if chunks else ()
    report = SessionReport(f"s-{group}-{turn}", metrics, errors, 0.0, appends * 200.0, chunks * 1000.0,
                           ttfp_s + chunks, closed_cleanly=not errors)
    spec = TurnSpec(group, turn, "hello", "voice_11", 4, 4, 0)
    return TurnRecord(spec, f"s-{group}-{turn}", report, 0, tuple(0.2 * k for k in range(appends)), events)


@pytest.fixture
def record_factory():
    return make_record
