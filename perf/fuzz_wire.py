"""Sending fuzz steps (perf/fuzz_inputs.py) to a server and reading what came back.

A `Wire` is one gRPC stream; requests on it go one step at a time, so an in-band error, whose
request id tritonclient 2.51 drops, belongs to the oldest request still waiting for its FINAL.
A `Session` is a duplex session held open on its own wire (the canary, the fuzz session).
"""
from __future__ import annotations

import json
import queue
import uuid
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from backends.contracts.messages import ThinkerRequest, stop_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving.stage_channel import infer_inputs
from backends.serving.stage_health import health_request
from backends.serving.stage_secret import SECRET_PARAMETER
from client.stream_close import stop_stream
from perf.fuzz_inputs import Step, TensorSpec

ANSWER_TIMEOUT_S = 30.0  # far past any answer's time: a request without one is a hang
TRITON_DTYPES = {"bool": "BOOL", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
                 "uint8": "UINT8", "float16": "FP16", "float32": "FP32", "float64": "FP64", "bytes": "BYTES"}


@dataclass
class Item:
    request_id: str
    final: bool
    event: dict | None = None
    error: str | None = None


@dataclass
class Outcome:
    """What one request got: `ok` (an empty FINAL), `created` (a START's session.created),
    `refused` (a START's `error` event), `failed` (an in-band error) or `timeout`."""

    kind: str
    message: str = ""
    events: list[dict] = field(default_factory=list)


class Wire:
    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self._items: queue.Queue[Item] = queue.Queue()
        self._waiting: list[str] = []  # request ids without their FINAL, oldest first
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self._items.put(Item(getattr(error, "request_id", None) or "", True, error=str(error)))
            return
        response = result.get_response()
        raw = result.as_numpy("EVENT")
        event = json.loads(raw[0]) if raw is not None and raw.size else None
        self._items.put(Item(response.id, response.parameters["triton_final_response"].bool_param, event))

    def send(self, model: str, inputs: list, **kwargs: object) -> str:
        request_id = f"fz-{uuid.uuid4().hex[:12]}"
        self._waiting.append(request_id)
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True,
                                       **kwargs)
        return request_id

    def next(self, skip: str | None = None, timeout_s: float = ANSWER_TIMEOUT_S) -> Item:
        """The next response; an anonymous error goes to the oldest waiting request (not `skip`,
        a downlink that may be open while an uplink request waits)."""
        item = self._items.get(timeout=timeout_s)
        if not item.request_id:
            owners = [rid for rid in self._waiting if rid != skip] or self._waiting
            item.request_id = owners[0] if owners else ""
        if item.final and item.request_id in self._waiting:
            self._waiting.remove(item.request_id)
        return item

    def answer(self, request_id: str, downlink: "Session | None" = None) -> Outcome:
        """Responses until `request_id`'s FINAL; the downlink's go to `downlink`."""
        events: list[dict] = []
        try:
            while True:
                item = self.next(skip=downlink.start_id if downlink else None)
                if downlink is not None and item.request_id == downlink.start_id:
                    downlink.take(item)
                    continue
                if item.request_id != request_id:
                    continue
                if item.error is not None:
                    return Outcome("failed", item.error, events)
                if item.event is not None:
                    events.append(item.event)
                if item.final:
                    return _start_outcome(events) if events else Outcome("ok", events=events)
        except queue.Empty:
            return Outcome("timeout", f"no FINAL for request {request_id} in {ANSWER_TIMEOUT_S:.0f} s", events)

    def first(self, request_id: str) -> Item | None:
        """The first response of `request_id` (a START's answer), None when none came."""
        try:
            while True:
                item = self.next()
                if item.request_id == request_id:
                    return item
        except queue.Empty:
            return None

    def close(self) -> None:
        stop_stream(self.client, cancel=True)
        self.client.close()


def _start_outcome(events: list[dict]) -> Outcome:
    first = events[0]
    if first.get("type") == "session.created":
        return Outcome("created", events=events)
    return Outcome("refused", f"[{first.get('code')}] {first.get('message')}", events)


class Session:
    """A duplex session held open on its own wire; its downlink events collect in `events`."""

    def __init__(self, url: str, session_id: str, audio: np.ndarray | None = None, **params: object) -> None:
        self.wire = Wire(url)
        self.session_id = session_id
        self.events: list[dict] = []
        self.closed = False
        self.start_id = self.wire.send("duplex", audio_inputs(audio), sequence_id=session_id, sequence_start=True,
                                       parameters=params or None)
        first = self.wire.first(self.start_id)
        if first is None or first.event is None or first.event.get("type") != "session.created":
            raise RuntimeError(f"session {session_id} was not created: {first}")
        self.take(first)

    def take(self, item: Item) -> None:
        if item.event is not None:
            self.events.append(item.event)
        self.closed = self.closed or item.final

    def request(self, inputs: list, start: bool = False, end: bool = False,
                params: dict[str, object] | None = None) -> Outcome:
        request_id = self.wire.send("duplex", inputs, sequence_id=self.session_id, sequence_start=start,
                                    sequence_end=end, parameters=params or None)
        return self.wire.answer(request_id, downlink=self)

    def append(self, audio: np.ndarray | None = None, **params: object) -> Outcome:
        return self.request(audio_inputs(audio), params=params)

    def wait_for(self, event_type: str, timeout_s: float = 120.0) -> dict | None:
        """The first downlink event of `event_type`, None if the downlink closed or went quiet."""
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("type") == event_type:
                    return event
            seen = len(self.events)
            if self.closed:
                return None
            try:
                item = self.wire.next(timeout_s=timeout_s)
            except queue.Empty:
                return None
            if item.request_id == self.start_id:
                self.take(item)

    def end(self) -> bool:
        """END, then wait for the downlink's FINAL; False when it did not come."""
        if not self.closed:
            self.request([], end=True)
        return self.wait_closed()

    def wait_closed(self) -> bool:
        """Wait for the downlink's FINAL; False when it did not come."""
        while not self.closed:
            try:
                item = self.wire.next(timeout_s=ANSWER_TIMEOUT_S)
            except queue.Empty:
                return False
            if item.request_id == self.start_id:
                self.take(item)
        return True

    def close(self) -> None:
        self.wire.close()


def audio_inputs(audio: np.ndarray | None) -> list[grpcclient.InferInput]:
    return [] if audio is None else tensor_inputs((TensorSpec("AUDIO", "int16", audio.shape),), audio)


def tensor_inputs(specs: tuple[TensorSpec, ...], data: np.ndarray | None = None) -> list[grpcclient.InferInput]:
    inputs = []
    for spec in specs:
        array = spec.array() if data is None else data
        tensor = grpcclient.InferInput(spec.name, list(array.shape), TRITON_DTYPES[spec.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def stage_inputs(step: Step, request_id: str) -> list[grpcclient.InferInput]:
    """A well-formed stage request of the kind the step names."""
    if step.stage_request == "health":
        message = health_request(step.target)
    elif step.stage_request == "stop":
        message = stop_request(step.target, request_id)
    elif step.target == "thinker":
        seq = 0 if step.stage_request == "setup" else 1
        message = ThinkerRequest(request_id=request_id, audio=np.zeros(16000 * seq, np.float32), seq=seq)
    else:  # a talker or code2wav stop request is its smallest well-formed message
        message = stop_request(step.target, request_id)
    return infer_inputs(to_arrays(message))


def stage_parameters(how: str, secret: str | None) -> dict[str, object] | None:
    """The secret parameter as a stranger would send it: never the server's own value."""
    real = secret or "0" * 64
    wrong = {"wrong": "f" * len(real) if real != "f" * len(real) else "0" * len(real), "empty": "",
             "short": real[: len(real) // 2], "int": 12345, "bool": True}
    return None if how == "absent" else {SECRET_PARAMETER: wrong[how]}
