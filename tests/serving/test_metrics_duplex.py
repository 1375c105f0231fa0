"""Duplex metrics from the events of a session, with a scripted clock and a fake metric API.

Strategy: push a known event sequence (two responses, one cancelled; an error; a refused
START) through MeteredDownlink / MeteredUplinkReply and check exact gauge, counter and
histogram values after the MetricsThread drained, and that events reach the inner downlink
unchanged and in order.
"""
from __future__ import annotations

import numpy as np
import pytest

from backends.duplex import events as ev
from backends.duplex.errors import DuplexError
from backends.serving.metrics_catalog import (
    ACTIVE_SESSIONS, CHUNK_GAP, ERRORS, RESPONSES, SESSIONS_OPENED, TTFP,
)
from backends.serving.metrics_duplex import DuplexMetrics
from backends.serving.metrics_thread import MetricsThread

GAP_TOLERANCE_MS = 1e-6  # scripted clock: the gaps are exact up to float rounding


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.events: list[ev.ServerEvent] = []
        self.closed = 0
        self.failed: list[str] = []

    def send(self, event: ev.ServerEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed += 1

    def ok(self) -> None:
        pass

    def fail(self, error: DuplexError) -> None:
        self.failed.append(error.code)


def _event(kind: str, audio: np.ndarray | None = None, **fields: object) -> ev.ServerEvent:
    return ev.ServerEvent(kind, "s1", dict(fields), audio)


def _audio(after_s: float, response_id: str, **fields: object) -> tuple[float, ev.ServerEvent]:
    """An audio delta sent `after_s` after the previous event."""
    return after_s, _event(ev.RESPONSE_AUDIO_DELTA, np.zeros(960, np.int16), response_id=response_id, **fields)


def _now(event: ev.ServerEvent) -> tuple[float, ev.ServerEvent]:
    return 0.0, event


@pytest.fixture
def setup(pb):
    clock = Clock()
    metrics = DuplexMetrics(MetricsThread(pb, "duplex", "duplex_0_0"), clock)
    return metrics, clock


def test_one_session_gives_exact_metrics(pb, setup):
    metrics, clock = setup
    inner = Recorder()
    down = metrics.downlink(inner)
    script = [
        _now(_event(ev.SESSION_CREATED, epoch=0)),
        _now(_event(ev.RESPONSE_CREATED, response_id="r0")),
        _audio(0.0, "r0", ttfp_ms=240.5),
        _audio(0.8, "r0"),
        _audio(1.1, "r0"),
        _now(_event(ev.RESPONSE_DONE, response_id="r0", status="completed")),
        _now(_event(ev.RESPONSE_CREATED, response_id="r1")),
        _audio(5.0, "r1", ttfp_ms=95.0),  # a new response: no gap to r0's last chunk
        _audio(0.5, "r1"),
        _now(_event(ev.ERROR, code="invalid_argument", message="bad append")),
        _now(_event(ev.RESPONSE_DONE, response_id="r1", status="cancelled")),
        _now(_event(ev.SESSION_CLOSED, reason="client")),
    ]
    for after_s, event in script:
        clock.now += after_s
        down.send(event)
    down.close()
    metrics.uplink_reply(Recorder()).fail(DuplexError("session_not_found", "no such session"))
    metrics.shutdown()
    assert inner.events == [event for _, event in script]
    assert inner.closed == 1
    assert pb.value(SESSIONS_OPENED.name) == 1 and pb.value(ACTIVE_SESSIONS.name) == 0
    assert pb.observed(TTFP.name) == [240.5, 95.0]
    assert pb.observed(CHUNK_GAP.name) == pytest.approx([800.0, 1100.0, 500.0], abs=GAP_TOLERANCE_MS)
    assert pb.value(RESPONSES.name, status="completed") == 1 and pb.value(RESPONSES.name, status="cancelled") == 1
    assert pb.value(ERRORS.name, code="invalid_argument", channel="downlink") == 1
    assert pb.value(ERRORS.name, code="session_not_found", channel="uplink") == 1
    assert pb.value(ERRORS.name) == 2


def test_active_sessions_counts_open_sessions_only(pb, setup):
    metrics, _ = setup
    downs = [metrics.downlink(Recorder()) for _ in range(3)]
    for down in downs:
        down.send(_event(ev.SESSION_CREATED, epoch=0))
    downs[0].send(_event(ev.SESSION_CLOSED, reason="idle"))
    downs[0].send(_event(ev.SESSION_CLOSED, reason="idle"))  # a repeat must not count twice
    refused = metrics.downlink(Recorder())  # a START over the limit: error, never created
    refused.send(_event(ev.ERROR, code="resource_exhausted", message="full"))
    refused.close()
    metrics.shutdown()
    assert pb.value(ACTIVE_SESSIONS.name) == 2 and pb.value(SESSIONS_OPENED.name) == 3
    assert pb.value(ERRORS.name, code="resource_exhausted") == 1


def test_a_failing_metric_update_still_forwards_the_event(pb, setup):
    metrics, _ = setup
    metrics.shutdown()  # the metrics thread is gone: updates queue up unread
    inner = Recorder()
    down = metrics.downlink(inner)
    down.send(_event(ev.SESSION_CREATED, epoch=0))
    reply = Recorder()
    metrics.uplink_reply(reply).fail(DuplexError("invalid_argument", "x"))
    assert [e.type for e in inner.events] == [ev.SESSION_CREATED] and reply.failed == ["invalid_argument"]
