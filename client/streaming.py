"""Real-time streaming of one utterance through a duplex session, with per-turn metrics.

Flow: START -> wait for session.created -> the utterance in `append_ms` pieces -> silence
(full duplex: silence is traffic) until a response has finished and none is open, for at most
`max_seconds` of silence -> END -> read the downlink until the session is settled. A refused
START gets no END: the server ended its sequence before answering (`DuplexSession.end`).

Pacing uses absolute deadlines (t0 + n * append_ms / speed), so client jitter never
accumulates. Waiting for the next deadline is spent reading events; their arrival times were
stamped on the stream thread, so the metrics do not depend on when they are read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from client.events import (
    DuplexEvent,
    ErrorEvent,
    RequestFailed,
    ResponseDone,
    SessionClosed,
    SessionCreated,
    is_error,
)
from client.metrics import OUTPUT_SAMPLE_RATE, SessionReport, compute_turn_metrics
from client.params import SessionParams
from client.recorder import TurnRecorder
from client.errors import DuplexProtocolError, DuplexStreamError, DuplexTimeout
from client.session import INPUT_SAMPLE_RATE, DuplexSession

EventHook = Callable[[DuplexEvent], None]


@dataclass(frozen=True, slots=True)
class StreamConfig:
    append_ms: int = 200  # audio per uplink request
    speed: float = 1.0  # pacing factor: 2.0 streams twice as fast as real time
    max_seconds: float = 60.0  # most silence (audio seconds) streamed while awaiting the reply
    created_timeout_s: float = 30.0  # START -> session.created
    close_timeout_s: float = 60.0  # END -> downlink FINAL and every uplink FINAL

    def __post_init__(self) -> None:
        if self.append_ms <= 0:
            raise ValueError(f"append_ms must be > 0, got {self.append_ms}")
        if not self.speed > 0.0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if not self.max_seconds > 0.0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if not (self.created_timeout_s > 0.0 and self.close_timeout_s > 0.0):
            raise ValueError(
                f"timeouts must be > 0, got {self.created_timeout_s} and {self.close_timeout_s}"
            )

    @property
    def append_samples(self) -> int:
        return INPUT_SAMPLE_RATE * self.append_ms // 1000

    @property
    def period_s(self) -> float:
        """Wall time between two appends."""
        return self.append_ms / 1000.0 / self.speed


def stream_utterance(
    session: DuplexSession,
    pcm16: np.ndarray,
    params: SessionParams | None = None,
    config: StreamConfig | None = None,
    *,
    ref_audio: np.ndarray | None = None,
    on_event: EventHook | None = None,
) -> SessionReport:
    """Run one session: `pcm16` is [n] int16 16 kHz mono. The caller closes `session`.

    Server errors, timeouts and broken streams end up in `SessionReport.errors`; misuse
    (bad arrays, a session already started) raises.
    """
    config = config or StreamConfig()
    if pcm16.dtype != np.int16 or pcm16.ndim != 1:
        raise ValueError(f"pcm16 must be [n] int16 at 16 kHz, got {pcm16.dtype} {pcm16.shape}")
    started_s = session.start(params, ref_audio)
    run = SessionRun(session, TurnRecorder(started_s), on_event)
    silence_ms = 0.0
    try:
        if run.wait_created(config.created_timeout_s):
            silence_ms = run.stream(pcm16, config)
        run.finish(config.close_timeout_s)
    except (DuplexTimeout, DuplexStreamError, DuplexProtocolError) as exc:
        run.errors.append(f"{type(exc).__name__}: {exc}")
    return run.report(pcm16.shape[0] * 1000.0 / INPUT_SAMPLE_RATE, silence_ms, started_s)


class SessionRun:
    """The state of one streamed session: `stream_utterance`'s, or the live microphone's
    (client/live.py)."""

    def __init__(self, session: DuplexSession, recorder: TurnRecorder, on_event: EventHook | None):
        self.session = session
        self.recorder = recorder
        self.errors: list[str] = []
        self.saw_closed = False
        self._on_event = on_event

    def wait_created(self, timeout_s: float) -> bool:
        deadline_s = time.monotonic() + timeout_s
        while True:
            event = self.session.next_event(max(deadline_s - time.monotonic(), 0.0))
            if event is None:
                break
            self.observe(event)
            if isinstance(event, SessionCreated):
                return True
            if isinstance(event, (ErrorEvent, RequestFailed)):
                return False
        self.errors.append("the downlink closed before session.created")
        return False

    def stream(self, pcm16: np.ndarray, config: StreamConfig) -> float:
        """Stream the utterance, then silence; returns the ms of silence streamed."""
        step = config.append_samples
        t0_s = time.monotonic()
        pieces = [pcm16[i : i + step] for i in range(0, pcm16.shape[0], step)]
        for index, piece in enumerate(pieces):
            self._wait_until(t0_s + index * config.period_s)
            if not self._send(piece):
                return 0.0
        silence = np.zeros(step, dtype=np.int16)
        max_pieces = math.ceil(config.max_seconds * 1000.0 / config.append_ms)
        for index in range(max_pieces + 1):
            # Events first: the check must see every answer to the appends sent so far.
            self._wait_until(t0_s + (len(pieces) + index) * config.period_s)
            if self._turn_finished() or index == max_pieces or not self._send(silence):
                break
        if not self._turn_finished():
            self.errors.append(f"no finished response after {config.max_seconds} s of silence")
        return index * config.append_ms

    def finish(self, timeout_s: float) -> None:
        self.session.end()
        for event in self.session.drain(timeout_s):
            self.observe(event)

    def observe(self, event: DuplexEvent) -> None:
        self.recorder.on_event(event)
        if is_error(event):
            self.errors.append(_describe_error(event))
        if isinstance(event, SessionClosed):
            self.saw_closed = True
        if self._on_event is not None:
            self._on_event(event)

    def observe_all(self, events: list[DuplexEvent]) -> None:
        for event in events:
            self.observe(event)

    def stream_blocks(self, blocks: Iterable[np.ndarray]) -> float:
        """Send each block as it comes (a live source paces itself), reading the events that
        arrived meanwhile; returns the ms of audio sent."""
        sent = 0
        for block in blocks:
            self.observe_all(self.session.events_until(time.monotonic()))
            if block.size and not self._send(block):
                break
            sent += block.shape[0]
        return sent * 1000.0 / INPUT_SAMPLE_RATE

    def report(self, input_ms: float, silence_ms: float, started_s: float) -> SessionReport:
        timelines = self.recorder.timelines()
        return SessionReport(
            session_id=self.session.session_id,
            turns=tuple(compute_turn_metrics(timeline, i) for i, timeline in enumerate(timelines)),
            errors=tuple(self.errors),
            input_ms=input_ms,
            silence_ms=float(silence_ms),
            reply_audio_ms=self.session.reply_audio().shape[0] * 1000.0 / OUTPUT_SAMPLE_RATE,
            wall_s=time.monotonic() - started_s,
            closed_cleanly=self.saw_closed and self.session.is_settled,
        )

    def _wait_until(self, deadline_s: float) -> None:
        self.observe_all(self.session.events_until(deadline_s))

    def _send(self, piece: np.ndarray) -> bool:
        if not self.session.downlink_open:
            self.errors.append("the server closed the downlink while audio was streaming")
            return False
        self.recorder.on_append(self.session.append(piece))
        return True

    def _turn_finished(self) -> bool:
        return self.recorder.num_done >= 1 and not self.recorder.has_open_response


def _describe_error(event: DuplexEvent) -> str:
    if isinstance(event, ErrorEvent):
        return f"error event {event.code}: {event.message}"
    if isinstance(event, RequestFailed):
        return f"request failed: {event.message}"
    if isinstance(event, ResponseDone):
        return f"response {event.response_id} failed"
    return f"{event.type}"
