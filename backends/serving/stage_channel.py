"""StageChannel: one gRPC channel to a stage model and at most one open stream on it.

A stream carries one request at a time (tritonclient 2.51 drops the request id of in-band
errors, so a stream must not carry two at once). It stays open after a call for the next call
on its channel (a stream per call cost 1.2-1.3 ms more per stage call on the 2-core CI machine:
`perf/bench_stage_calls.py`). A stage's error answer is its request's FINAL, so the stream stays
usable after one too.

A call that ends before its FINAL (the caller stopped reading, or the stage went quiet for the
timeout) is never cancelled: Triton 2.51's gRPC frontend can crash when a cancellation races
the request's completion (server#7368, #8034; seen once in ~7 CI runs of the 200-session leak
test). The request runs on to its end, which the session's explicit `stop` request brings
quickly, and the channel is `draining` until that FINAL has arrived; `ready` reports when the
stream can carry the next call. Streams are ended by half-closing them (`half_close`).

Every request carries the server's stage secret, when the channel has one
(backends/serving/stage_secret.py): the stages refuse any other but `health`.
"""
from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from backends.contracts.errors import StageError
from backends.contracts.stage_clients import StageCallError
from backends.serving.metrics_stage_calls import SENT_NS_PARAMETER, call_metrics_enabled
from backends.serving.stage_secret import secret_parameters
from backends.serving.triton_responses import parse_error_message
from client.stream_close import half_close

log = logging.getLogger(__name__)

# Ending a stream waits this long for the server to finish what it carries before cancelling.
DEFAULT_CLOSE_WAIT_S = 5.0
_TRITON_DTYPES = {np.float32: "FP32", np.float16: "FP16", np.int64: "INT64", np.int32: "INT32", np.int16: "INT16",
                  np.int8: "INT8", np.uint8: "UINT8", np.bool_: "BOOL", np.object_: "BYTES"}


def infer_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _TRITON_DTYPES[array.dtype.type])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _is_final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


class StageChannel:
    """`call` sends one request and yields the answers that carry outputs up to the FINAL."""

    def __init__(self, url: str, timeout_s: float, secret: str | None = None) -> None:
        self._timeout_s = timeout_s
        self._secret_parameters = secret_parameters(secret)
        self._client = grpcclient.InferenceServerClient(url)
        self._stamp_sends = call_metrics_enabled()  # the stages time each request's arrival from it
        self._answers: queue.SimpleQueue[tuple[Any, Any]] | None = None  # the open stream's
        self.usable = True  # cleared when the channel itself broke
        self.draining = False  # a call ended before its FINAL, which has not arrived yet
        self.last_used = time.monotonic()

    @property
    def has_stream(self) -> bool:
        return self._answers is not None

    def call(self, model: str, arrays: dict[str, np.ndarray]) -> Iterator[Any]:
        """Results (tritonclient InferResult); raises StageCallError on the stage's error."""
        answers = self._send(model, arrays)
        finished = False
        try:
            while True:
                result, error = self._next(model, answers)
                if error is not None:
                    finished = True  # the stage's error is its FINAL; a stream error breaks the channel
                    raise StageCallError(model, self._stage_error(model, error))
                # A stage's last result comes on its FINAL: the call is finished before it is
                # handed out, in case the caller stops reading there.
                finished = _is_final(result)
                if result.get_response().outputs:
                    yield result
                if finished:
                    return
        finally:
            self.last_used = time.monotonic()
            self.draining = not finished and self.has_stream

    def post(self, model: str, arrays: dict[str, np.ndarray]) -> None:
        """Send a request whose answer nobody reads (an announcement): the channel drains its
        FINAL as it does an abandoned call's, and drops a stage error with it."""
        self._send(model, arrays)
        self.last_used = time.monotonic()
        self.draining = True

    def _send(self, model: str, arrays: dict[str, np.ndarray]) -> queue.SimpleQueue[tuple[Any, Any]]:
        if not self.ready():
            raise RuntimeError("a stage channel got a call while its last request is still live")
        answers = self._open_stream()
        try:
            self._client.async_stream_infer(model, infer_inputs(arrays), request_id=uuid.uuid4().hex,
                                            enable_empty_final_response=True, parameters=self._parameters())
        except Exception:
            self.usable = False  # the stream refused the request: it is not worth another call
            raise
        return answers

    def _parameters(self) -> dict[str, object] | None:
        stamp = {SENT_NS_PARAMETER: time.monotonic_ns()} if self._stamp_sends else {}
        return {**self._secret_parameters, **stamp} or None

    def ready(self) -> bool:
        """Whether the channel can carry a call: not draining, or the FINAL it waits for has
        arrived (read here without waiting)."""
        while self.draining:
            try:
                result, error = self._answers.get_nowait()
            except queue.Empty:
                return False
            if error is not None and error.status() is not None:
                self.usable = False  # the stream itself failed: nothing more will arrive
            self.draining = error is None and not _is_final(result)
        return self.usable

    def _open_stream(self) -> queue.SimpleQueue[tuple[Any, Any]]:
        if self._answers is not None and not self._answers.empty():
            self.end_stream()  # an answer while idle: the stream itself failed (server stopping)
        if self._answers is None:
            answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
            self._client.start_stream(callback=lambda result, error: answers.put((result, error)))
            self._answers = answers
        return self._answers

    def _stage_error(self, model: str, error: Any) -> StageError:
        if error.status() is None:  # in-band: the stage's own answer, "[code] message"
            return parse_error_message(error.message())
        self.usable = False  # the stream itself failed (server stopping, connection lost)
        return StageError("unavailable", f"{model} unreachable: {error.status()} {error.message()}")

    def _next(self, model: str, answers: queue.SimpleQueue) -> tuple[Any, Any]:
        try:
            return answers.get(timeout=self._timeout_s)
        except queue.Empty:
            raise StageCallError(model, StageError("stage_timeout", f"no answer from {model} for "
                                                                     f"{self._timeout_s:.0f} s")) from None

    def end_stream(self, wait_s: float = DEFAULT_CLOSE_WAIT_S) -> None:
        """Half-close the open stream, if any: idle, it ends at once; draining, the server ends
        it after the live request's FINAL, cancelled only if that takes more than `wait_s`."""
        if self._answers is None:
            return
        self._answers, self.draining = None, False
        try:
            if not half_close(self._client, wait_s):
                log.warning("a stage stream did not end within %.1f s of its half-close: cancelled", wait_s)
        except Exception as exc:
            log.debug("closing a stage stream failed: %r", exc)
            self.usable = False

    def close(self, wait_s: float = DEFAULT_CLOSE_WAIT_S) -> None:
        self.end_stream(wait_s)
        try:
            self._client.close()
        except Exception as exc:  # a broken channel: nothing more to free
            log.debug("closing a stage channel failed: %r", exc)
