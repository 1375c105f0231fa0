"""Turn bookkeeping: folds uplink append times and downlink events into `TurnTimeline`s.

A turn starts at the first uplink append after the previous response finished (or after
START). A response that opens before any such append (a text-primed session, or a second
response right after the first) starts its turn at START or at the previous response.done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from client.events import AudioDelta, DuplexEvent, ResponseCreated, ResponseDone, TextDelta
from client.metrics import ChunkArrival, TurnTimeline


@dataclass(slots=True)
class _ResponseLog:
    response_id: str
    turn_start_s: float
    status: str | None = None
    first_text_s: float | None = None
    server_ttft_ms: float | None = None
    server_ttfp_ms: float | None = None
    chunks: list[ChunkArrival] = field(default_factory=list)


class TurnRecorder:
    def __init__(self, session_start_s: float):
        self._fallback_start_s = session_start_s
        self._turn_start_s: float | None = None  # first append of the current turn
        self._responses: dict[str, _ResponseLog] = {}  # insertion order = opening order
        self._open: list[str] = []  # response ids without response.done, oldest first

    @property
    def has_open_response(self) -> bool:
        return bool(self._open)

    @property
    def num_done(self) -> int:
        return sum(log.status is not None for log in self._responses.values())

    def on_append(self, sent_s: float) -> None:
        if self._turn_start_s is None:
            self._turn_start_s = sent_s

    def on_event(self, event: DuplexEvent) -> None:
        if isinstance(event, ResponseCreated):
            self._log(event.response_id)
        elif isinstance(event, TextDelta):
            self._on_text(event)
        elif isinstance(event, AudioDelta):
            self._on_audio(event)
        elif isinstance(event, ResponseDone):
            self._on_done(event)

    def timelines(self) -> list[TurnTimeline]:
        return [
            TurnTimeline(
                response_id=log.response_id,
                turn_start_s=log.turn_start_s,
                status=log.status,
                first_text_s=log.first_text_s,
                server_ttft_ms=log.server_ttft_ms,
                server_ttfp_ms=log.server_ttfp_ms,
                chunks=tuple(log.chunks),
            )
            for log in self._responses.values()
        ]

    def _log(self, response_id: str) -> _ResponseLog:
        log = self._responses.get(response_id)
        if log is None:
            start_s = self._fallback_start_s if self._turn_start_s is None else self._turn_start_s
            log = self._responses[response_id] = _ResponseLog(response_id, start_s)
            self._open.append(response_id)
        return log

    def _on_text(self, event: TextDelta) -> None:
        log = self._log(event.response_id)
        if event.text and log.first_text_s is None:
            log.first_text_s = event.received_s
        if event.ttft_ms is not None and log.server_ttft_ms is None:
            log.server_ttft_ms = event.ttft_ms

    def _on_audio(self, event: AudioDelta) -> None:
        log = self._log(event.response_id)
        log.chunks.append(ChunkArrival(event.received_s, int(event.audio.shape[0])))
        # The server may carry text only here (no text delta); the first text still counts.
        if event.text and log.first_text_s is None:
            log.first_text_s = event.received_s
        if event.ttfp_ms is not None and log.server_ttfp_ms is None:
            log.server_ttfp_ms = event.ttfp_ms

    def _on_done(self, event: ResponseDone) -> None:
        response_id = event.response_id
        if response_id is None:
            if not self._open:
                return  # nothing to close: a done for a response we never saw open
            response_id = self._open[-1]
        log = self._log(response_id)
        log.status = event.status
        if response_id in self._open:
            self._open.remove(response_id)
        self._turn_start_s = None
        self._fallback_start_s = event.received_s
