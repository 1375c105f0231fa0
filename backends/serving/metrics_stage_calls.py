"""The orchestrator's latency of each stage call, by stage (diagnostics, off by default).

`MeteredStageClients` wraps the `StageClients` the duplex sessions call and observes, per call,
the time from issuing it to its first result (a Thinker unit's result, a Talker request's first
codes, a Code2Wav window's audio) as `minicpmo_stage_call_ms{stage}`. A reply's audio tail is a
Talker call then a Code2Wav call, so under load the histogram shows which of the two a slow
first audio waited on. Off unless MINICPMO_STAGE_CALL_METRICS=1: every observation is a metric
update through the instance's `MetricsThread`, whose calls into the metric API take the
orchestrator's GIL, and at 32 sessions that is ~100 more per second (not yet measured on a GPU).
Iterators are closed when the caller stops early, as the wrapped clients expect.

The same switch has the stage models time the hops of a call: with it, every orchestrator
request carries its send time (`SENT_NS_PARAMETER`, the host's monotonic clock, which every
process on the host shares), from which a stage observes the request's arrival at `execute`
(`minicpmo_stage_arrival_ms`), and each response's way to the server (`minicpmo_stage_send_ms`).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult,
)
from backends.contracts.stage_clients import CODE2WAV, TALKER, THINKER, StageClients
from backends.serving.metrics_catalog import STAGE_CALL
from backends.serving.metrics_thread import MetricsThread

CALL_METRICS_ENV = "MINICPMO_STAGE_CALL_METRICS"  # "1": observe every stage call
SENT_NS_PARAMETER = "sent_ns"  # request parameter: time.monotonic_ns() when the orchestrator sent it
T = TypeVar("T")


def call_metrics_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """CALL_METRICS_ENV: "1" on, "0" or unset off; any other value is refused, so a typo never
    leaves the diagnostics off unnoticed (the launcher checks it before it starts anything)."""
    value = environ.get(CALL_METRICS_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{CALL_METRICS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def with_call_metrics(clients: StageClients, metrics: MetricsThread,
                      environ: Mapping[str, str] = os.environ) -> StageClients:  # fmt: skip
    """`clients`, metered when CALL_METRICS_ENV is "1"."""
    return MeteredStageClients(clients, metrics) if call_metrics_enabled(environ) else clients


def sent_ns_of(parameters: str) -> int | None:
    """A stage request's send time from its parameters (Triton's JSON); None when absent or
    not an integer (a client other than the orchestrator)."""
    try:
        value = json.loads(parameters or "{}").get(SENT_NS_PARAMETER)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class MeteredStageClients:
    """StageClients that observe each call's time to its first result, then pass it on."""

    def __init__(self, inner: StageClients, metrics: MetricsThread,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._inner, self._metrics, self._clock = inner, metrics, clock

    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]:
        return self._timed(THINKER, self._clock(), self._inner.thinker(request))

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]:
        return self._timed(TALKER, self._clock(), self._inner.talker(request))

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        start = self._clock()
        audio = self._inner.code2wav(request)
        self._observe(CODE2WAV, start)
        return audio

    def stop(self, stage: str, request_id: str) -> None:
        self._inner.stop(stage, request_id)

    def expect_window(self, request_id: str) -> None:
        self._inner.expect_window(request_id)

    def _timed(self, stage: str, start: float, results: Iterator[T]) -> Iterator[T]:
        first = True
        try:
            for item in results:
                if first:
                    first = False
                    self._observe(stage, start)
                yield item
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()

    def _observe(self, stage: str, start: float) -> None:
        self._metrics.observe(STAGE_CALL, 1000.0 * (self._clock() - start), stage=stage)
