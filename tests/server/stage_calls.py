"""Direct requests to a stage model (thinker, talker, code2wav) on a real server.

A request is a contract dataclass (backends/contracts/messages.py) encoded by the same
`to_arrays` the orchestrator uses; each call gets its own gRPC stream, because tritonclient
2.51 drops the request id of in-band errors (a stream with one request in flight needs none).
Answers are decoded back into the contract's result class. `StageCall` reads a stream
incrementally (a test can act between two results); `call` waits for the FINAL. Every request
carries the server's stage secret (`StageEndpoint.of(server)`), as the orchestrator's do.
"""
from __future__ import annotations

import queue
import uuid
from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc as grpcclient

from backends.contracts.messages import stop_request
from backends.contracts.tensor_codec import from_arrays, to_arrays
from backends.serving.stage_channel import infer_inputs
from backends.serving.stage_secret import secret_parameters

ANSWER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StageEndpoint:
    """Where the stages of a test server answer, and the secret they want."""

    url: str
    secret: str | None

    @staticmethod
    def of(server: Any) -> "StageEndpoint":
        return StageEndpoint(server.grpc_url, server.stage_secret)


@dataclass
class Answer:
    results: list[Any] = field(default_factory=list)
    error: str | None = None  # the in-band error of the request, if any
    responses: int = 0  # responses received, the FINAL included
    final_carried_result: bool = False  # the FINAL response had outputs (the last result)


class StageCall:
    """One request in flight on its own stream."""

    def __init__(self, stages: StageEndpoint, model: str, request: Any, result_cls: type | None) -> None:
        self._result_cls = result_cls
        self._items: queue.Queue = queue.Queue()
        self._client = grpcclient.InferenceServerClient(stages.url)
        self._client.start_stream(callback=lambda result, error: self._items.put((result, error)))
        self.answer = Answer()
        self.done = False
        self._client.async_stream_infer(model, infer_inputs(to_arrays(request)), request_id=f"sc-{uuid.uuid4().hex[:8]}",
                                        enable_empty_final_response=True,
                                        parameters=secret_parameters(stages.secret) or None)

    def next_result(self, timeout_s: float = ANSWER_TIMEOUT_S) -> Any | None:
        """The next decoded result; None once the request ended (with or without an error)."""
        while not self.done:
            result, error = self._items.get(timeout=timeout_s)
            if error is not None:
                self.answer.error, self.done = str(error), True
                break
            response = result.get_response()
            self.done = response.parameters["triton_final_response"].bool_param
            self.answer.responses += 1
            self.answer.final_carried_result = self.done and bool(response.outputs)
            if self._result_cls is not None and response.outputs:
                decoded = from_arrays(self._result_cls, result.as_numpy)
                self.answer.results.append(decoded)
                return decoded
        self.close()
        return None

    def wait(self, timeout_s: float = ANSWER_TIMEOUT_S) -> Answer:
        while self.next_result(timeout_s) is not None:
            pass
        return self.answer

    def close(self) -> None:
        if self._client is not None:
            self._client.stop_stream()
            self._client.close()
            self._client = None


def call(stages: StageEndpoint, model: str, request: Any, result_cls: type | None = None) -> Answer:
    return StageCall(stages, model, request, result_cls).wait()


def stop(stages: StageEndpoint, model: str, request_id: str) -> None:
    answer = call(stages, model, stop_request(model, request_id))
    assert answer.error is None, f"stop of {model} {request_id}: {answer.error}"
