"""A fake Triton client + `duplex` model for the client tests (not a MagicMock).

`FakeTritonClient` has the methods of `tritonclient.grpc.InferenceServerClient` that a
session uses, with their real semantics: requests are encoded by tritonclient's own request
builder (so reserved or mistyped parameters fail as they would on the wire), responses are
real `InferResult` protobufs delivered by a separate thread through the callback, and every
use that the real client or the server would reject raises `FakeContractViolation` (or the
real client's `InferenceServerException`), so a client bug cannot pass silently.

Default server behaviour: START -> `session.created` on the downlink; every other request ->
one empty FINAL at once; END -> `session.closed` and the downlink FINAL. Tests script the
rest through `on_request(fake, request)` and `emit(...)`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

START_PARAMETERS = {
    "instructions": "string_param",
    "initial_user_text": "string_param",
    "temperature": "double_param",
    "voice": "string_param",
    "seed": "int64_param",
    "reply_units": "int64_param",
    "reply_tokens_per_unit": "int64_param",
    "force_listen_count": "int64_param",
    "top_k": "int64_param",
    "top_p": "double_param",
    "max_new_speak_tokens_per_chunk": "int64_param",
    "listen_prob_scale": "double_param",
    "text_repetition_penalty": "double_param",
    "text_repetition_window_size": "int64_param",
    "listen_when_silent": "bool_param",
}
ACTIONS = ("append", "commit", "cancel")
_THREAD_JOIN_S = 30.0  # the delivery thread only forwards queued items: a bound, not a timing


class FakeContractViolation(Exception):
    """The client did something the real tritonclient or the duplex server would reject."""


def make_response(
    request_id: str,
    *,
    event: dict[str, Any] | None = None,
    audio: np.ndarray | None = None,  # [n] int16
    final: bool = False,
) -> InferResult:
    """A real gRPC `ModelInferResponse` as tritonclient hands it to the stream callback."""
    response = service_pb2.ModelInferResponse(model_name="duplex", id=request_id)
    if event is not None:
        text = np.array([json.dumps(event).encode()], dtype=np.object_)  # [1] bytes
        _add_output(response, "EVENT", "BYTES", [1], serialize_byte_tensor(text).item())
    if audio is not None:
        _add_output(response, "AUDIO_OUT", "INT16", [audio.shape[0]], audio.astype("<i2").tobytes())
    if final:
        response.parameters["triton_final_response"].bool_param = True
    return InferResult(response)


def _add_output(response: Any, name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    output = response.outputs.add()
    output.name, output.datatype = name, datatype
    output.shape.extend(shape)
    response.raw_output_contents.append(raw)


def is_start(request: Any) -> bool:
    return request.parameters["sequence_start"].bool_param


class FakeTritonClient:
    Violation = FakeContractViolation

    def __init__(self, *, ready: bool = True, send_created: bool = True,
                 close_on_end: bool = True, refuse_start: str | None = None,
                 fail_start: str | None = None,
                 on_request: Callable[[FakeTritonClient, Any], None] | None = None):
        self.ready = ready
        self.send_created = send_created
        self.close_on_end = close_on_end
        # The duplex model's refusal of START: an `error` event with this message, then the
        # FINAL; the model ended the sequence before answering.
        self.refuse_start = refuse_start
        self.fail_start = fail_start  # Triton fails START with this in-band error instead
        self.on_request = on_request
        self.requests: list[Any] = []  # ModelInferRequest protobufs, in send order
        self.request_times: list[float] = []  # time.monotonic() of each, for pacing checks
        self.stop_calls: list[bool] = []  # cancel_requests of each stop_stream call
        self.session_id: str | int | None = None
        self._callback: Callable[..., None] | None = None
        self._outbox: queue.Queue[tuple[Any, Any] | None] = queue.Queue()
        self._handed = threading.Condition()  # guards the two counts below
        self._num_queued = 0
        self._num_handed = 0  # responses the delivery thread gave to the callback
        self._thread: threading.Thread | None = None
        self._closed = False
        self._downlink_id: str | None = None  # START's request id while the downlink is open
        self._sequence_live = False
        self._ended = False
        self._broken = False  # after a gRPC failure the real client refuses new requests

    def is_model_ready(self, model_name: str, model_version: str = "", headers: Any = None,
                       client_timeout: float | None = None) -> bool:
        self._check_not_closed()
        return self.ready and model_name == "duplex"

    def start_stream(self, callback: Callable[..., None], stream_timeout: float | None = None,
                     headers: Any = None, compression_algorithm: str | None = None) -> None:
        self._check_not_closed()
        if self._callback is not None:
            raise InferenceServerException("cannot start another stream with one already running")
        self._callback = callback
        self._thread = threading.Thread(target=self._deliver_loop, daemon=True)
        self._thread.start()

    def async_stream_infer(self, model_name: str, inputs: list[Any], model_version: str = "",
                           outputs: Any = None, request_id: str = "", sequence_id: str | int = 0,
                           sequence_start: bool = False, sequence_end: bool = False,
                           enable_empty_final_response: bool = False, priority: int = 0,
                           timeout: int | None = None, parameters: dict | None = None) -> None:
        if self._callback is None:
            raise InferenceServerException("stream not available, use start_stream() first")
        if self._broken:
            raise InferenceServerException("The stream is no longer in valid state")
        request = _get_inference_request(
            model_name=model_name, inputs=inputs, model_version=model_version,
            request_id=request_id, outputs=outputs, sequence_id=sequence_id,
            sequence_start=sequence_start, sequence_end=sequence_end, priority=priority,
            timeout=timeout, parameters=parameters,
        )
        self._validate(request, sequence_id, enable_empty_final_response)
        self.requests.append(request)
        self.request_times.append(time.monotonic())
        self._serve(request)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.stop_calls.append(cancel_requests)
        if self._callback is None:
            return
        if not cancel_requests and self._downlink_id is not None:
            raise FakeContractViolation(
                "graceful stop_stream with the downlink open would block forever: the real"
                " client joins its stream thread until every request got its FINAL"
            )
        self._outbox.put(None)
        self._thread.join(_THREAD_JOIN_S)
        if self._thread.is_alive():
            raise FakeContractViolation("delivery thread did not stop")
        self._callback = None

    def close(self) -> None:
        self.stop_stream()
        self._closed = True

    @staticmethod
    def audio_of(request: Any) -> np.ndarray:
        """[n] int16: the AUDIO input of a recorded request."""
        names = [tensor.name for tensor in request.inputs]
        return np.frombuffer(request.raw_input_contents[names.index("AUDIO")], dtype="<i2")

    @staticmethod
    def action_of(request: Any) -> str | None:
        params = request.parameters
        return params["action"].string_param if "action" in params else None

    def uplink_requests(self) -> list[Any]:
        return [request for request in self.requests if not is_start(request)]

    def emit(self, event: dict[str, Any], audio: np.ndarray | None = None, *,
             final: bool = False) -> None:
        """Send one downlink event (session_id filled in); `final` closes the downlink with it."""
        if self._downlink_id is None:
            raise FakeContractViolation(f"emit {event.get('type')!r} with no open downlink")
        payload = {"session_id": self.session_id, **event}
        self.deliver(make_response(self._downlink_id, event=payload, audio=audio, final=final))
        if final:
            self._downlink_id = None

    def close_downlink(self) -> None:
        if self._downlink_id is None:
            raise FakeContractViolation("downlink closed twice")
        self.deliver(make_response(self._downlink_id, final=True))
        self._downlink_id = None

    def fail_request(self, message: str) -> None:
        """An in-band error response (what a model's TritonError looks like to the client)."""
        self.deliver(error=InferenceServerException(message))

    def break_stream(self, message: str = "connection reset") -> None:
        """A gRPC-level failure: the stream is over."""
        self.deliver(error=InferenceServerException(message, status="StatusCode.UNAVAILABLE"))
        self._downlink_id = None
        self._broken = True

    def deliver(self, result: InferResult | None = None, error: Any = None) -> None:
        with self._handed:
            self._num_queued += 1
        self._outbox.put((result, error))

    def flush(self) -> None:
        """Wait until the delivery thread has handed every queued response to the callback. A
        script that calls it answers before the request returns, however late a loaded machine
        runs the delivery thread."""
        with self._handed:
            if not self._handed.wait_for(lambda: self._num_handed == self._num_queued, _THREAD_JOIN_S):
                raise FakeContractViolation("queued responses never reached the callback")

    def _deliver_loop(self) -> None:
        while (item := self._outbox.get()) is not None:
            result, error = item
            self._callback(result=result, error=error)
            with self._handed:
                self._num_handed += 1
                self._handed.notify_all()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise FakeContractViolation("client used after close()")

    def _validate(self, request: Any, sequence_id: str | int, empty_final: bool) -> None:
        if request.model_name != "duplex":
            raise FakeContractViolation(f"unknown model {request.model_name!r}")
        if not empty_final:
            raise FakeContractViolation("without enable_empty_final_response no empty FINAL comes")
        if "sequence_id" not in request.parameters:
            raise FakeContractViolation("request outside a sequence (sequence_id 0 or '')")
        if not request.id or request.id == self._downlink_id:
            raise FakeContractViolation(f"request id {request.id!r} empty or in use")
        if self.session_id is not None and sequence_id != self.session_id:
            raise FakeContractViolation(f"sequence id changed to {sequence_id!r}")
        if is_start(request) and (self.session_id is not None or self._ended):
            raise FakeContractViolation("second START on one stream")
        if self._ended:
            raise FakeContractViolation("request after END")
        _validate_inputs(request)
        _validate_parameters(request)

    def _serve(self, request: Any) -> None:
        if is_start(request):
            self._serve_start(request)
        elif not self._sequence_live:
            # What Triton's sequence batcher answers for a sequence it does not know.
            self.fail_request(f"inference request for sequence {request.parameters['sequence_id']}"
                              " must specify the START flag on the first request")
        else:
            self.deliver(make_response(request.id, final=True))
        if self.on_request is not None and self._sequence_live:
            self.on_request(self, request)
        if request.parameters["sequence_end"].bool_param:
            self._ended = True
            if self._sequence_live and self.close_on_end and self._downlink_id is not None:
                self.emit({"type": "session.closed", "reason": "client_end"})
                self.close_downlink()

    def _serve_start(self, request: Any) -> None:
        param = request.parameters["sequence_id"]
        self.session_id = param.string_param or param.int64_param
        if self.fail_start is not None:
            self.fail_request(self.fail_start)
            return
        if self.refuse_start is not None:
            self._downlink_id = request.id
            self.emit({"type": "error", "code": "resource_exhausted", "message": self.refuse_start})
            self.close_downlink()
            return
        self._sequence_live = True
        self._downlink_id = request.id
        if self.send_created:
            self.emit({"type": "session.created"})


def _validate_inputs(request: Any) -> None:
    tensors = {tensor.name: tensor for tensor in request.inputs}
    allowed = {"AUDIO", "REF_AUDIO"} if is_start(request) else {"AUDIO"}
    if "AUDIO" not in tensors or not set(tensors) <= allowed:
        raise FakeContractViolation(f"inputs {sorted(tensors)}; allowed {sorted(allowed)}")
    for index, tensor in enumerate(request.inputs):
        if tensor.datatype != "INT16" or len(tensor.shape) != 1:
            raise FakeContractViolation(f"{tensor.name} must be INT16 [-1], got {tensor}")
        if len(request.raw_input_contents[index]) != 2 * tensor.shape[0]:
            raise FakeContractViolation(f"{tensor.name} byte size does not match its shape")


def _validate_parameters(request: Any) -> None:
    for key, value in request.parameters.items():
        if key in ("sequence_id", "sequence_start", "sequence_end"):
            continue
        kind = value.WhichOneof("parameter_choice")
        if key == "action" and (kind != "string_param" or value.string_param not in ACTIONS):
            raise FakeContractViolation(f"bad action {value}")
        elif key == "sample_rate" and (kind != "int64_param" or value.int64_param != 16000):
            raise FakeContractViolation(f"bad sample_rate {value}")
        elif key in START_PARAMETERS and (not is_start(request) or kind != START_PARAMETERS[key]):
            raise FakeContractViolation(f"{key} ({kind}): START-only {START_PARAMETERS[key]}")
        elif key not in START_PARAMETERS and key not in ("action", "sample_rate"):
            raise FakeContractViolation(f"unknown request parameter {key!r}")


@pytest.fixture
def make_result() -> Callable[..., InferResult]:
    """`make_response` (see above), for tests that feed responses by hand."""
    return make_response


@pytest.fixture
def fake_client_factory() -> Iterator[Callable[..., FakeTritonClient]]:
    """Builds fakes and stops their delivery threads at teardown."""
    made: list[FakeTritonClient] = []

    def build(**kwargs: Any) -> FakeTritonClient:
        made.append(FakeTritonClient(**kwargs))
        return made[-1]

    yield build
    for fake in made:
        if fake._callback is not None:
            fake.stop_stream(cancel_requests=True)
