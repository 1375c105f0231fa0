"""Metrics of the `duplex` orchestrator, read off the traffic it already produces.

`MeteredDownlink` wraps one session's downlink and observes each server event on its way
out: session.created / session.closed move the active-sessions gauge, the first audio delta
of a response carries the server's `ttfp_ms`, later deltas give the inter-chunk gap, error
events count by code, response.done counts by status. `MeteredUplinkReply` counts failed
uplink requests. Nothing here calls the metric API: updates go to the instance's
`MetricsThread`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from backends.duplex import events as ev
from backends.duplex.errors import DuplexError
from backends.duplex.session import Downlink
from backends.duplex.session_manager import UplinkReply
from backends.serving.metrics_catalog import (
    ACTIVE_SESSIONS, CHANNEL_DOWNLINK, CHANNEL_UPLINK, CHUNK_GAP, ERRORS, RESPONSES, SESSIONS_OPENED, TTFP,
)
from backends.serving.metrics_thread import MetricsThread


class DuplexMetrics:
    def __init__(self, metrics: MetricsThread, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock

    def downlink(self, inner: Downlink) -> "MeteredDownlink":
        return MeteredDownlink(inner, self._metrics, self._clock)

    def uplink_reply(self, inner: UplinkReply) -> "MeteredUplinkReply":
        return MeteredUplinkReply(inner, self._metrics)

    def shutdown(self) -> None:
        self._metrics.shutdown()


class MeteredDownlink:
    """One session's downlink; observes every event, then forwards it unchanged."""

    def __init__(self, inner: Downlink, metrics: MetricsThread, clock: Callable[[], float]) -> None:
        self._inner, self._metrics, self._clock = inner, metrics, clock
        self._lock = threading.Lock()  # the session's thinker and audio threads both send
        self._last_audio: dict[str, float] = {}  # response_id -> send time of its last audio chunk
        self._created = False

    def send(self, event: ev.ServerEvent) -> None:
        try:
            self._observe(event)
        finally:
            self._inner.send(event)

    def close(self) -> None:
        self._inner.close()

    def is_cancelled(self) -> bool:
        return self._inner.is_cancelled()

    def move(self, to: Downlink, notice: ev.ServerEvent) -> bool:
        """The metering stays with the session: `to` lends only its transport."""
        return self._inner.move(to._inner if isinstance(to, MeteredDownlink) else to, notice)

    def abandon(self) -> None:
        self._inner.abandon()

    def _observe(self, event: ev.ServerEvent) -> None:
        kind, fields = event.type, event.fields
        if kind == ev.RESPONSE_AUDIO_DELTA:
            self._observe_audio(str(fields.get("response_id", "")), fields.get("ttfp_ms"))
        elif kind == ev.SESSION_CREATED:
            self._created = True
            self._metrics.increment(SESSIONS_OPENED)
            self._metrics.increment(ACTIVE_SESSIONS, 1.0)
        elif kind == ev.SESSION_CLOSED and self._created:
            self._created = False
            self._metrics.increment(ACTIVE_SESSIONS, -1.0)
        elif kind == ev.ERROR:
            self._metrics.increment(ERRORS, code=str(fields.get("code", "unknown")), channel=CHANNEL_DOWNLINK)
        elif kind == ev.RESPONSE_DONE:
            with self._lock:
                self._last_audio.pop(str(fields.get("response_id", "")), None)
            self._metrics.increment(RESPONSES, status=str(fields.get("status", "unknown")))

    def _observe_audio(self, response_id: str, ttfp_ms: object) -> None:
        now = self._clock()
        with self._lock:
            previous = self._last_audio.get(response_id)
            self._last_audio[response_id] = now
        if isinstance(ttfp_ms, (int, float)):
            self._metrics.observe(TTFP, float(ttfp_ms))
        if previous is not None:
            self._metrics.observe(CHUNK_GAP, 1000.0 * (now - previous))


class MeteredUplinkReply:
    """The answer to one uplink request; counts it when it fails."""

    def __init__(self, inner: UplinkReply, metrics: MetricsThread) -> None:
        self._inner, self._metrics = inner, metrics

    def ok(self) -> None:
        self._inner.ok()

    def fail(self, error: DuplexError) -> None:
        try:
            self._metrics.increment(ERRORS, code=error.code, channel=CHANNEL_UPLINK)
        finally:
            self._inner.fail(error)
