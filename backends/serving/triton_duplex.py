"""Triton side of the `duplex` orchestrator: uplink requests, the downlink, uplink replies.

The stages are not called from here: `duplex` calls them over gRPC streams to its own server
(backends/serving/grpc_stages.py), its only stage transport.

Sequence slots: Triton frees a session's slot only when an END request is released or its
own idle timer fires, and until then counts the sequence in flight (a server stop waits
`--exit-timeout-secs` for it). When a session ends without the client's END (client gone,
idle, error), the downlink therefore sends the orchestrator itself an END for that sequence
(`abandon`), marked with `RELEASE_PARAMETER` so that `execute` answers it without touching any
session. A later request of that client meets Triton's "must specify the START flag" error.
A refused START is released the same way, before its refusal is sent (backends/duplex/refusals.py):
Triton forgets the correlation id as soon as that END is queued, so a START retried with the
same id after the answer opens a new sequence, which the release cannot end. A START refused
because its id is an open session's is not released: Triton joined it to that session's sequence.

A readiness probe (`is_health_probe`, backends/serving/duplex_health.py) is answered the same
way, with an empty FINAL and no session: its START|END opens and frees its sequence at once.

That END is a BLS request, the one BLS call left, and it is not a stage call: it carries no
tensor either way (its answer is one empty FINAL), so neither 2.51 BLS defect that moved the
stage calls to gRPC can touch it (output tensors unpacked without the GIL; a non-first error
response dropped). BLS hands the correlation id straight to this model's sequence batcher,
in process: no stream to open, drain and close for a request that only frees a slot.
"""
from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from backends.duplex.downlink import Downlink
from backends.duplex.errors import DuplexError
from backends.duplex.events import ServerEvent
from backends.duplex.session import SessionConfig
from backends.duplex.session_manager import ManagerConfig
from backends.duplex.uplink import RawUplink
from backends.serving.duplex_health import HEALTH_PARAMETER
from backends.serving.triton_responses import ResponseThread
from backends.serving.triton_tensors import output_tensors, tensor_to_numpy

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


def is_health_probe(pb_utils: Any, request: Any) -> bool:
    """Whether `request` is a readiness probe (backends/serving/duplex_health.py): START and END
    together, no input tensor, and the probe mark as its only parameter. Only that exact form is
    answered without the session manager, so the mark cannot skip a session request's checks."""
    both = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    if request.flags() & both != both:
        return False
    if any(pb_utils.get_input_tensor_by_name(request, name) is not None for name in ("AUDIO", "REF_AUDIO")):
        return False
    try:
        params = json.loads(request.parameters() or "{}")
    except ValueError:
        return False
    own = {k: v for k, v in params.items() if not k.startswith("triton_")} if isinstance(params, dict) else {}
    return own == {HEALTH_PARAMETER: True} and own[HEALTH_PARAMETER] is True


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
    """The response sender of the request that carries a session's events: its START, or the
    latest request it moved its downlink to (`move`).

    `close` lets go of the sender: the stub frees the request's response factory, which pins
    the `duplex` model (a server stop waits for it), only when the sender object is destroyed,
    and a finished session may live on in a reference cycle until the garbage collector runs.
    `is_cancelled` and `close` exclude each other: a cancellation check that reaches the server
    after the FINAL asks about a response factory the server may already have freed (seen as
    heap corruption in tritonserver and as a `duplex` model that never unloads). A send is
    ordered against a move and the close: no response may follow its request's FINAL.
    """

    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread,
                 sequence: tuple[str, int | str] | None = None) -> None:
        self._pb, self._sender, self._responses = pb_utils, sender, responses
        self._sequence = sequence  # (model name, correlation id as the client sent it)
        self._lock = threading.Lock()  # guards _sender between close()/move() and is_cancelled()
        self._send_lock = threading.Lock()  # orders send() against move() and close()

    def send(self, event: ServerEvent) -> None:
        response = self._response(event)
        with self._send_lock:
            if self._sender is None:
                raise RuntimeError(f"event {event.type} after the downlink closed")
            self._responses.put(self._sender, response, 0)

    def close(self) -> None:
        with self._lock, self._send_lock:
            sender, self._sender = self._sender, None
            if sender is not None:
                self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def move(self, to: Downlink, notice: ServerEvent) -> bool:
        if not isinstance(to, TritonDownlink):
            raise TypeError(f"a downlink moves only to another TritonDownlink, got {type(to).__name__}")
        response = self._response(notice)
        with self._lock, self._send_lock:
            if self._sender is None:
                return False
            old, self._sender = self._sender, to._hand_over()
            self._responses.put(old, response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return True

    def is_cancelled(self) -> bool:
        with self._lock:  # held across the IPC: the FINAL cannot be queued meanwhile
            return self._sender is not None and bool(self._sender.is_cancelled())

    def abandon(self) -> None:
        """Free the session's sequence slot (its client is gone): an END to ourselves, over
        BLS (the module docstring says why that is safe here)."""
        if self._sequence is None:
            return
        model, correlation_id = self._sequence
        bls = self._pb.InferenceRequest(
            model_name=model, inputs=[], requested_output_names=[], correlation_id=correlation_id,
            flags=self._pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END, parameters={RELEASE_PARAMETER: True})
        for _ in bls.exec(decoupled=True):  # drained: the answer carries nothing
            pass

    def _hand_over(self) -> Any:
        """This downlink's sender, taken: the moving downlink sends on it from now on."""
        with self._lock, self._send_lock:
            sender, self._sender = self._sender, None
        if sender is None:
            raise RuntimeError("a downlink moved to a request that was already answered")
        return sender

    def _response(self, event: ServerEvent) -> Any:
        arrays = {"EVENT": np.array([event.to_json().encode("utf-8")], dtype=np.object_)}
        if event.audio is not None:
            arrays["AUDIO_OUT"] = event.audio
        return self._pb.InferenceResponse(output_tensors=output_tensors(self._pb, arrays))


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


def manager_config(params: dict[str, str]) -> ManagerConfig:
    return ManagerConfig(max_sessions=int(params["max_sessions"]), idle_timeout_s=float(params["idle_timeout_s"]),
                         max_append_ms=int(params["max_append_ms"]),
                         session=SessionConfig(max_uplink_ahead_s=float(params["max_uplink_ahead_s"])))
