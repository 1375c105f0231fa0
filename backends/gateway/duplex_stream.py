"""One session's gRPC stream to the `duplex` model (tritonclient.grpc.aio): requests go into an
asyncio queue that feeds the stream, downlink events come out of `downlink` in order.

Every `downlink_move_s` an append first moves the downlink to a fresh request (`move_downlink`,
docs/duplex_contract.md): the server holds what it answered on an open request until its FINAL.

Leaving a session never cancels the RPC while requests are in flight (Triton 2.51's gRPC
frontend can crash when a cancellation races a completion): `end()` sends END and then ends the
request iterator, a half-close; the server finishes the session and ends the downlink. Only a
stream that does not end after that is cancelled (`abort`).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio

from backends.gateway.config import DOWNLINK_MOVE_S

MODEL = "duplex"
START_REQUEST_ID = "down"
# The answers to uplink requests and the downlink's end are flags-only FINALs, sent on request.
EMPTY_FINAL = {"triton_enable_empty_final_response": True}
DOWNLINK_MOVED = "downlink.moved"  # the old downlink request's last event: followed, not shown


@dataclass(frozen=True, slots=True)
class DuplexEvent:
    """One downlink event: the JSON object of EVENT, and AUDIO_OUT on response.audio.delta."""

    type: str
    fields: dict[str, Any]
    audio: np.ndarray | None = None  # int16 24 kHz


def stream_lost(message: str) -> DuplexEvent:
    """What the downlink says when the stream broke before the server closed the session."""
    return DuplexEvent("session.closed", {"reason": "error", "stream_error": message})


@dataclass
class DuplexStream:
    client: grpcaio.InferenceServerClient
    session_id: str
    _requests: asyncio.Queue = field(default_factory=asyncio.Queue)
    _responses: Any = None
    downlink: Any = None  # the async iterator of DuplexEvent, from `open` on
    _count: int = 0
    _ended: bool = False
    uplink_errors: list[str] = field(default_factory=list)  # anonymous request failures
    downlink_move_s: float = DOWNLINK_MOVE_S
    _downlink_id: str = START_REQUEST_ID  # the request that carries the downlink now
    _moving: str | None = None  # a move request the server has not taken yet
    _moved_s: float = field(default_factory=time.monotonic)

    def open(self, params: dict[str, Any], ref_audio: np.ndarray | None = None) -> None:
        """START the session (answered on the downlink: session.created or an error)."""
        inputs = [_audio_input("AUDIO", np.zeros(0, np.int16))]
        if ref_audio is not None:
            inputs.append(_audio_input("REF_AUDIO", ref_audio))
        self._put(inputs, START_REQUEST_ID, sequence_start=True, extra=params)
        self._responses = self.client.stream_infer(self._iterate())
        self.downlink = self._events()

    def append(self, pcm16: np.ndarray, action: str = "append") -> None:
        if self._ended:
            return
        if self._moving is None and time.monotonic() - self._moved_s >= self.downlink_move_s:
            self._moving, self._moved_s = self._next_id(), time.monotonic()
            self._put([_audio_input("AUDIO", np.zeros(0, np.int16))], self._moving, extra={"action": "move_downlink"})
        extra = {} if action == "append" else {"action": action}
        self._put([_audio_input("AUDIO", pcm16)], self._next_id(), extra=extra)

    def end(self) -> None:
        """END the session and half-close the stream (idempotent)."""
        if self._ended:
            return
        self._put([_audio_input("AUDIO", np.zeros(0, np.int16))], self._next_id(), sequence_end=True)
        self._ended = True
        self._requests.put_nowait(None)

    def abort(self) -> None:
        """Cancel the RPC: for a stream that did not end after END."""
        if self._responses is not None:
            self._responses.cancel()
        if not self._ended:
            self._ended = True
            self._requests.put_nowait(None)

    def release(self) -> None:
        """End the stream of a session the server closed or refused (its sequence is over:
        no END); idempotent."""
        if not self._ended:
            self._ended = True
            self._requests.put_nowait(None)

    async def _events(self) -> AsyncIterator[DuplexEvent]:
        """The downlink, up to its FINAL; a broken stream ends it with `stream_lost`."""
        try:
            async for result, error in self._responses:
                if error is not None:
                    self.uplink_errors.append(str(error))
                    continue
                response = result.get_response()
                if response.id == self._moving:  # the move request answers: it carries the downlink
                    self._downlink_id, self._moving = response.id, None
                event = _event_of(result)
                if event is not None and event.type == DOWNLINK_MOVED:
                    if self._moving is not None:
                        self._downlink_id, self._moving = self._moving, None
                    continue
                if response.id != self._downlink_id:
                    continue  # an uplink request's empty FINAL
                if event is not None:
                    yield event
                if response.parameters["triton_final_response"].bool_param:
                    return
        except Exception as err:  # grpc.aio errors, cancellation of the RPC
            yield stream_lost(f"{type(err).__name__}: {err}")

    def _next_id(self) -> str:
        self._count += 1
        return f"up-{self._count}"

    def _put(self, inputs: list, request_id: str, sequence_start: bool = False, sequence_end: bool = False,
             extra: dict[str, Any] | None = None) -> None:
        self._requests.put_nowait({
            "model_name": MODEL, "inputs": inputs, "request_id": request_id, "sequence_id": self.session_id,
            "sequence_start": sequence_start, "sequence_end": sequence_end,
            "parameters": {**EMPTY_FINAL, **(extra or {})},
        })

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while (request := await self._requests.get()) is not None:
            yield request


def _audio_input(name: str, pcm16: np.ndarray) -> grpcaio.InferInput:
    tensor = grpcaio.InferInput(name, [int(pcm16.size)], "INT16")
    tensor.set_data_from_numpy(np.ascontiguousarray(pcm16, dtype=np.int16))
    return tensor


def _event_of(result: Any) -> DuplexEvent | None:
    raw = result.as_numpy("EVENT")
    if raw is None:
        return None
    text = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
    body = json.loads(text)
    kind = body.pop("type")
    body.pop("session_id", None)
    audio = result.as_numpy("AUDIO_OUT") if kind == "response.audio.delta" else None
    return DuplexEvent(kind, body, audio)
