"""One benchmark turn: its own duplex session, silence streamed in real time until the reply is done.

The session opens with the turn's text as `initial_user_text`, the group's voice as REF_AUDIO
and the forced reply shape, then streams 16 kHz silence in `append_ms` appends on absolute
deadlines (`client.streaming.stream_utterance`) until `response.done`, for at most
`max_silence_s`, then ENDs and drains the session. A START refused with
`resource_exhausted` is retried with backoff for up to `open_retry_s` (as vLLM-Omni's
benchmark does); every retry is counted. Besides the client's `SessionReport`, the record
keeps the send time of every append and the arrival of every per-unit event, from which
`stage_breakdown` estimates where the time of a unit goes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from client.events import AudioDelta, DuplexEvent, ResponseListen, TextDelta
from client.metrics import SessionReport, TurnMetrics
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance
from perf.workload import TurnSpec

RESOURCE_EXHAUSTED = "resource_exhausted"
BACKOFF_START_S = 0.25
BACKOFF_MAX_S = 2.0
EMPTY_UTTERANCE = np.zeros(0, dtype=np.int16)  # [0] int16: the turn is silence only


@dataclass(frozen=True, slots=True)
class TurnOptions:
    url: str
    append_ms: int = 200
    max_silence_s: float = 30.0
    open_retry_s: float = 120.0
    created_timeout_s: float = 60.0
    close_timeout_s: float = 60.0  # END -> settled; a healthy session settles in seconds
    instructions: str | None = None
    temperature: float | None = None
    gateway_url: str | None = None  # ws://host:port: the turn goes through the WebSocket gateway

    def __post_init__(self) -> None:
        if self.append_ms <= 0 or self.max_silence_s <= 0 or self.open_retry_s < 0:
            raise ValueError(f"need append_ms > 0, max_silence_s > 0, open_retry_s >= 0, got "
                             f"{self.append_ms}, {self.max_silence_s}, {self.open_retry_s}")

    def stream_config(self) -> StreamConfig:
        return StreamConfig(append_ms=self.append_ms, max_seconds=self.max_silence_s,
                            created_timeout_s=self.created_timeout_s, close_timeout_s=self.close_timeout_s)


@dataclass(frozen=True, slots=True)
class UnitEvent:
    """A per-unit downlink event: `decision` (listen), `text` (a speak unit) or `audio`."""

    kind: str
    unit_index: int | None
    received_s: float  # client monotonic
    text: str = ""


@dataclass(frozen=True, slots=True)
class TurnRecord:
    spec: TurnSpec
    session_id: str
    report: SessionReport
    retries: int
    append_times_s: tuple[float, ...]  # send time of every uplink append, in order
    unit_events: tuple[UnitEvent, ...] = field(repr=False)

    @property
    def measured(self) -> TurnMetrics | None:
        """The response the turn is measured on: the first one that carried audio."""
        return next((t for t in self.report.turns if t.audio_ms > 0.0), None)

    @property
    def ok(self) -> bool:
        measured = self.measured
        return self.report.ok and measured is not None and measured.status == "completed"

    def pacing_lateness_ms(self, append_ms: int) -> float:
        """Worst lag of an append behind its absolute deadline (first append + k * append_ms):
        how precisely the client kept real time."""
        times = self.append_times_s
        if not times:
            return 0.0
        return max(0.0, max(1000.0 * (t - times[0]) - k * append_ms for k, t in enumerate(times)))


class TimedSession(DuplexSession):
    """A DuplexSession that remembers when each append was sent."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.append_times_s: list[float] = []

    def append(self, pcm16: np.ndarray) -> float:
        sent_s = super().append(pcm16)
        self.append_times_s.append(sent_s)
        return sent_s


def run_turn(spec: TurnSpec, voice: np.ndarray, options: TurnOptions, run_id: str) -> TurnRecord:
    """Run one turn (retrying a refused START); never raises for server-side failures."""
    if options.gateway_url:
        from perf.gateway_turn import run_gateway_turn  # imports this module

        return run_gateway_turn(spec, voice, options, run_id)
    deadline_s = time.monotonic() + options.open_retry_s
    backoff_s, retries = BACKOFF_START_S, 0
    while True:
        record = _attempt(spec, voice, options, f"{run_id}-g{spec.group}-t{spec.turn}-r{retries}", retries)
        if not _refused(record.report) or time.monotonic() + backoff_s > deadline_s:
            return record
        time.sleep(backoff_s)
        backoff_s, retries = min(2 * backoff_s, BACKOFF_MAX_S), retries + 1


def session_params(spec: TurnSpec, options: TurnOptions) -> SessionParams:
    return SessionParams(instructions=options.instructions, initial_user_text=spec.text,
                         temperature=options.temperature, seed=spec.seed, reply_units=spec.reply_units,
                         reply_tokens_per_unit=spec.tokens_per_unit)


def _attempt(spec: TurnSpec, voice: np.ndarray, options: TurnOptions, session_id: str, retries: int) -> TurnRecord:
    events: list[UnitEvent] = []
    started_s = time.monotonic()
    try:
        with TimedSession.connect(options.url, session_id) as session:
            report = stream_utterance(session, EMPTY_UTTERANCE, session_params(spec, options),
                                      options.stream_config(), ref_audio=voice,
                                      on_event=lambda event: _collect(event, events))
            appended = tuple(session.append_times_s)
    except Exception as exc:  # noqa: BLE001 - a client-side failure is a failed turn, counted like any other
        report = SessionReport(session_id, (), (f"{type(exc).__name__}: {exc}",), 0.0, 0.0, 0.0,
                               time.monotonic() - started_s, False)
        appended = ()
    return TurnRecord(spec, session_id, report, retries, appended, tuple(events))


def _collect(event: DuplexEvent, events: list[UnitEvent]) -> None:
    if isinstance(event, ResponseListen):
        events.append(UnitEvent("decision", _unit_index(event), event.received_s))
    elif isinstance(event, TextDelta):
        events.append(UnitEvent("text", _unit_index(event), event.received_s, event.text))
    elif isinstance(event, AudioDelta):
        events.append(UnitEvent("audio", None, event.received_s, event.text))


def _unit_index(event: ResponseListen | TextDelta) -> int | None:
    value = event.raw.get("unit_index")
    return value if isinstance(value, int) else None


def _refused(report: SessionReport) -> bool:
    return report.reply_audio_ms == 0.0 and any(RESOURCE_EXHAUSTED in error for error in report.errors)
