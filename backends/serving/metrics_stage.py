"""Metrics of a stage model (thinker, talker, code2wav) and its engine thread.

The engine thread reports each step's wall time (`on_step`), each request's wait for the thread
(`on_inbox_wait`), Code2Wav's window waits (`on_window_wait`); with the stage call metrics on,
`execute` reports each request's trip from the orchestrator (`on_arrival`) and the response
thread each response's way to the server (`on_send`); after each round, the
engine's `resource_counts()` (`publish`): the KV blocks in use follow from them, and the
counts themselves go to the resource gauges (backends/serving/resource_gauges.py). Failed
requests count by error code through `MeteredSink` and `count_error`. Every update is handed
to the instance's `MetricsThread`, the only thread that calls the metric API.
"""
from __future__ import annotations

from typing import Any

from backends.contracts.errors import StageError
from backends.contracts.sink import ResponseSink
from backends.serving.metrics_catalog import (
    CHANNEL_RESPONSE,
    ERRORS,
    INBOX_WAIT,
    KV_BLOCKS_IN_USE,
    STAGE_ARRIVAL,
    STAGE_SEND,
    STEP_TIME,
    WINDOW_WAIT,
)
from backends.serving.metrics_thread import MetricsThread


class StageMetrics:
    def __init__(self, metrics: MetricsThread, gauges: Any | None = None) -> None:
        self._metrics = metrics
        self._gauges = gauges  # ResourceGauges or None; run on the metrics thread only
        self._kv_in_use: int | None = None  # last published value (engine thread only)

    def on_step(self, seconds: float) -> None:
        """Engine thread: one engine step took `seconds`."""
        self._metrics.observe(STEP_TIME, 1000.0 * seconds)

    def on_inbox_wait(self, seconds: float) -> None:
        """Engine thread: a request waited `seconds` between its submit and its acceptance."""
        self._metrics.observe(INBOX_WAIT, 1000.0 * seconds)

    def on_window_wait(self, kind: str, seconds: float) -> None:
        """Engine thread: a Code2Wav window waited `seconds` before its forward began."""
        self._metrics.observe(WINDOW_WAIT, 1000.0 * seconds, kind=kind)

    def on_arrival(self, nanoseconds: int) -> None:
        """execute: a request arrived `nanoseconds` after the orchestrator sent it."""
        self._metrics.observe(STAGE_ARRIVAL, nanoseconds / 1e6)

    def on_send(self, seconds: float) -> None:
        """Response thread: a response reached the server `seconds` after it was handed over."""
        self._metrics.observe(STAGE_SEND, 1000.0 * seconds)

    def publish(self, counts: dict[str, int]) -> None:
        """Engine thread: the engine's resource counts after a round of commands and a step."""
        if self._gauges is not None:
            self._metrics.call(self._gauges.publish, dict(counts))
        if "kv_blocks" in counts and "kv_free_blocks" in counts:
            in_use = int(counts["kv_blocks"]) - int(counts["kv_free_blocks"])
            if in_use != self._kv_in_use:  # keep the queue quiet while nothing changes
                self._kv_in_use = in_use
                self._metrics.set(KV_BLOCKS_IN_USE, float(in_use))

    def count_error(self, code: str) -> None:
        self._metrics.increment(ERRORS, code=code, channel=CHANNEL_RESPONSE)

    def sink(self, inner: ResponseSink) -> "MeteredSink":
        return MeteredSink(inner, self)

    def shutdown(self) -> None:
        if self._gauges is not None:
            self._metrics.call(self._gauges.close)  # queued before the thread's stop
        self._metrics.shutdown()


class MeteredSink:
    """A ResponseSink that counts the error it is closed with."""

    def __init__(self, inner: ResponseSink, metrics: StageMetrics) -> None:
        self._inner, self._stage_metrics = inner, metrics
        self._counted = False

    @property
    def closed(self) -> bool:
        return bool(getattr(self._inner, "closed", False))

    def send(self, result: Any) -> None:
        self._inner.send(result)

    def finish(self, result: Any) -> None:
        self._inner.finish(result)

    def close(self, error: StageError | None = None) -> None:
        if error is not None and not self.closed and not self._counted:
            self._counted = True
            self._stage_metrics.count_error(error.code)
        self._inner.close(error)
