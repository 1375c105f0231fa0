"""Triton side of the `duplex` orchestrator: downlink, uplink replies, BLS stage clients.

Sequence slots: Triton frees a session's slot only when an END request is released or its
own idle timer fires, and until then counts the sequence in flight (a server stop waits
`--exit-timeout-secs` for it). When a session ends without the client's END (client gone,
idle, error), the downlink therefore sends the orchestrator itself an END for that sequence
(`abandon`), marked with `RELEASE_PARAMETER` so that `execute` answers it without touching any
session. A later request of that client meets Triton's "must specify the START flag" error.
A refused START is left to the client's END (our client always sends one): releasing it here
could end a retried START with the same id.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable, Iterator

import numpy as np

from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, expect_request,
    stop_request,
)
from backends.contracts.stage_clients import CODE2WAV, TALKER, THINKER, StageCallError
from backends.contracts.tensor_codec import from_arrays, tensor_specs, to_arrays
from backends.duplex.errors import DuplexError
from backends.duplex.events import ServerEvent
from backends.duplex.session_manager import ManagerConfig
from backends.duplex.uplink import RawUplink
from backends.serving.triton_responses import ResponseThread, parse_error_message
from backends.serving.triton_tensors import tensor_to_numpy, output_tensors

# DuplexError.code -> TritonError code attribute name
_UPLINK_ERROR_CODES = {"invalid_argument": "INVALID_ARG", "session_not_found": "NOT_FOUND",
                       "resource_exhausted": "UNAVAILABLE"}
RELEASE_PARAMETER = "duplex_release_sequence"  # request parameter of the orchestrator's own END


def is_sequence_release(request: Any) -> bool:
    """Whether `request` is the orchestrator's own END that frees a dead session's slot."""
    try:
        params = json.loads(request.parameters() or "{}")
    except ValueError:
        return False
    return isinstance(params, dict) and params.get(RELEASE_PARAMETER) is True


def raw_uplink(pb_utils: Any, request: Any) -> RawUplink:
    flags = request.flags()
    return RawUplink(
        session_id=str(request.correlation_id()),
        is_start=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
        is_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
        audio=_optional_input(pb_utils, request, "AUDIO"),
        ref_audio=_optional_input(pb_utils, request, "REF_AUDIO"),
        parameters=request.parameters() or "{}",
    )


def _optional_input(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor_to_numpy(tensor)


class TritonDownlink:
    """The START request's response sender, kept open for the whole session.

    `close` lets go of the sender: the stub frees the request's response factory, which pins
    the `duplex` model (a server stop waits for it), only when the sender object is destroyed,
    and a finished session may live on in a reference cycle until the garbage collector runs.
    `is_cancelled` and `close` exclude each other: a cancellation check that reaches the server
    after the FINAL asks about a response factory the server may already have freed (seen as
    heap corruption in tritonserver and as a `duplex` model that never unloads).
    """

    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread,
                 sequence: tuple[str, int | str] | None = None) -> None:
        self._pb, self._sender, self._responses = pb_utils, sender, responses
        self._sequence = sequence  # (model name, correlation id as the client sent it)
        self._lock = threading.Lock()  # guards _sender between close() and is_cancelled()

    def send(self, event: ServerEvent) -> None:
        if self._sender is None:
            raise RuntimeError(f"event {event.type} after the downlink closed")
        arrays = {"EVENT": np.array([event.to_json().encode("utf-8")], dtype=np.object_)}
        if event.audio is not None:
            arrays["AUDIO_OUT"] = event.audio
        response = self._pb.InferenceResponse(output_tensors=output_tensors(self._pb, arrays))
        self._responses.put(self._sender, response, 0)

    def close(self) -> None:
        with self._lock:
            sender, self._sender = self._sender, None
        if sender is not None:
            self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        with self._lock:  # held across the IPC: the FINAL cannot be queued meanwhile
            return self._sender is not None and bool(self._sender.is_cancelled())

    def abandon(self) -> None:
        """Free the session's sequence slot (its client is gone): an END to ourselves."""
        if self._sequence is None:
            return
        model, correlation_id = self._sequence
        bls = self._pb.InferenceRequest(
            model_name=model, inputs=[], requested_output_names=[], correlation_id=correlation_id,
            flags=self._pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, parameters={RELEASE_PARAMETER: True})
        for _ in bls.exec(decoupled=True):  # drained: the answer carries nothing
            pass


class TritonUplinkReply:
    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread) -> None:
        self._pb, self._sender, self._responses = pb_utils, sender, responses

    def ok(self) -> None:
        self._responses.put(self._take(), None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def fail(self, error: DuplexError) -> None:
        code = getattr(self._pb.TritonError, _UPLINK_ERROR_CODES.get(error.code, "INTERNAL"))
        response = self._pb.InferenceResponse(error=self._pb.TritonError(f"[{error.code}] {error.message}", code))
        self._responses.put(self._take(), response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _take(self) -> Any:
        """The sender, once: this object must not keep it alive (see TritonDownlink)."""
        sender, self._sender = self._sender, None
        if sender is None:
            raise RuntimeError("uplink request answered twice")
        return sender


class BlsStageClients:
    """StageClients over BLS: decoupled child requests, iterated on the calling thread."""

    def __init__(self, pb_utils: Any, timeout_us: int = 0) -> None:
        self._pb = pb_utils
        self._timeout_us = timeout_us

    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]:
        return self._stream(THINKER, request, ThinkerUnitResult)

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]:
        return self._stream(TALKER, request, TalkerCodes)

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        return list(self._stream(CODE2WAV, request, Code2WavAudio))

    def stop(self, stage: str, request_id: str) -> None:
        for _ in self._stream(stage, stop_request(stage, request_id), None):
            pass

    def expect_window(self, request_id: str) -> None:
        """Over BLS the announcement waits for its answer (given at once: ~1 ms)."""
        for _ in self._stream(CODE2WAV, expect_request(request_id), None):
            pass

    def _stream(self, model: str, request: Any, result_cls: type | None) -> Iterator[Any]:
        names = [spec.name for spec in tensor_specs(result_cls)] if result_cls else []
        bls = self._pb.InferenceRequest(model_name=model, inputs=output_tensors(self._pb, to_arrays(request)),
                                        requested_output_names=names, timeout=self._timeout_us)
        for response in bls.exec(decoupled=True):
            if response.has_error():
                raise StageCallError(model, parse_error_message(response.error().message()))
            if result_cls is None or not response.output_tensors():
                continue
            yield from_arrays(result_cls, _output_getter(self._pb, response))


def _output_getter(pb_utils: Any, response: Any) -> Callable[[str], np.ndarray | None]:
    def get(name: str) -> np.ndarray | None:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        return None if tensor is None else tensor_to_numpy(tensor)

    return get


def manager_config(params: dict[str, str]) -> ManagerConfig:
    return ManagerConfig(max_sessions=int(params["max_sessions"]), idle_timeout_s=float(params["idle_timeout_s"]),
                         max_append_ms=int(params["max_append_ms"]))
