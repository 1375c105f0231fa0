"""StageClients over gRPC streams to the server's own endpoint: how `duplex` calls the stages.

Why not BLS: two defects of the Python-backend stub of Triton 2.51, both reproduced on our
binaries with a two-model repository (a decoupled child, a parent calling it from threads):
- the stub builds the numpy arrays of a BLS response's output tensors without holding the GIL
  (`InferRequest::Exec` releases it for the whole call; later responses of a decoupled stream
  are loaded on a C++ thread), so any other Python thread of the caller corrupts the heap:
  the parent crashed within seconds whenever responses carried tensors and never without, and
  the `duplex` stub died in about one of three 200-session leak-test runs;
- an error response after the first response is dropped, its FINAL with it, so the caller's
  iterator waits forever (backends/serving/triton_responses.py).
A tritonclient stream receives on grpcio's own thread, under the GIL, and gets every response.

Each call opens a stream of its own for its one request (tritonclient 2.51 drops the request
id of in-band errors, so a stream must not carry two) and closes it at the end; the channels
under them are pooled per stage. A channel that broke is closed instead of returned.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from backends.duplex.stage_clients import CODE2WAV, TALKER, THINKER, StageCallError
from backends.serving.triton_responses import parse_error_message
from backends.stages.contracts import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, stop_request,
)
from backends.stages.sink import StageError
from backends.stages.tensor_codec import from_arrays, to_arrays
from client.stream_close import stop_stream

log = logging.getLogger(__name__)

STAGE_URL_ENV = "MINICPMO_STAGE_URL"  # set by the launcher: the server's own gRPC host:port
DEFAULT_STAGE_URL = "127.0.0.1:8001"
DEFAULT_TIMEOUT_S = 60.0  # a call that hears nothing for this long fails (stage_timeout)
DEFAULT_MAX_IDLE = 16  # idle channels kept per stage; more are closed when their call ends
_TRITON_DTYPES = {np.float32: "FP32", np.float16: "FP16", np.int64: "INT64", np.int32: "INT32", np.int16: "INT16",
                  np.int8: "INT8", np.uint8: "UINT8", np.bool_: "BOOL", np.object_: "BYTES"}


def stage_url(params: dict[str, str]) -> str:
    """The model parameter `stage_url`, else the launcher's environment, else Triton's port."""
    return params.get("stage_url") or os.environ.get(STAGE_URL_ENV) or DEFAULT_STAGE_URL


def infer_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _TRITON_DTYPES[array.dtype.type])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class StageChannel:
    """One gRPC channel; `call` opens a stream for one request, yields the answers that carry
    outputs up to the FINAL, and closes the stream: an idle channel holds no RPC open (an open
    stream would keep the server's own gRPC frontend from shutting down)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)
        self.usable = True  # cleared when the channel itself broke

    def call(self, model: str, arrays: dict[str, np.ndarray]) -> Iterator[Any]:
        """Results (tritonclient InferResult); raises StageCallError on the stage's error."""
        answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        request_id = uuid.uuid4().hex
        self._client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            self._client.async_stream_infer(model, infer_inputs(arrays), request_id=request_id,
                                            enable_empty_final_response=True)
            while True:
                result, error = self._next(model, answers)
                if error is not None:
                    raise StageCallError(model, self._stage_error(model, error))
                response = result.get_response()
                if response.outputs:
                    yield result
                if response.parameters["triton_final_response"].bool_param:
                    return
        finally:
            self._end_stream()

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

    def _end_stream(self) -> None:
        try:  # cancel: after the FINAL there is nothing left; before it, nothing is wanted
            stop_stream(self._client, cancel=True)
        except Exception as exc:
            log.debug("closing a stage stream failed: %r", exc)
            self.usable = False

    def close(self) -> None:
        try:
            self._client.close()
        except Exception as exc:  # a broken channel: nothing more to free
            log.debug("closing a stage channel failed: %r", exc)


class GrpcStageClients:
    """StageClients (backends/duplex/stage_clients.py) over pooled StageChannels."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_idle: int = DEFAULT_MAX_IDLE,
                 channel_factory: Callable[[str, float], StageChannel] = StageChannel) -> None:
        self._url, self._timeout_s, self._max_idle = url, timeout_s, max_idle
        self._new_channel = channel_factory  # tests pass a fake
        self._lock = threading.Lock()  # guards the fields below
        self._idle: dict[str, list[StageChannel]] = {}
        self._open = 0  # channels created and not closed (idle or in a call)
        self._closed = False

    def open_channels(self) -> int:
        with self._lock:
            return self._open

    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]:
        return self._results(THINKER, request, ThinkerUnitResult)

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]:
        return self._results(TALKER, request, TalkerCodes)

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        return list(self._results(CODE2WAV, request, Code2WavAudio))

    def stop(self, stage: str, request_id: str) -> None:
        for _ in self._results(stage, stop_request(stage, request_id), None):
            pass

    def close(self) -> None:
        """Close the idle channels; channels in use close when their calls end."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for channel in (c for channels in idle.values() for c in channels):
            self._close(channel)

    def _results(self, model: str, request: Any, result_cls: type | None) -> Iterator[Any]:
        channel = self._checkout(model)
        try:
            for result in channel.call(model, to_arrays(request)):
                if result_cls is not None:
                    yield from_arrays(result_cls, result.as_numpy)
        finally:
            self._checkin(model, channel)

    def _checkout(self, model: str) -> StageChannel:
        with self._lock:
            idle = self._idle.get(model)
            if idle:
                return idle.pop()
            self._open += 1
        try:
            return self._new_channel(self._url, self._timeout_s)
        except Exception:
            with self._lock:
                self._open -= 1
            raise

    def _checkin(self, model: str, channel: StageChannel) -> None:
        with self._lock:
            idle = self._idle.setdefault(model, [])
            if channel.usable and not self._closed and len(idle) < self._max_idle:
                idle.append(channel)
                return
        self._close(channel)

    def _close(self, channel: StageChannel) -> None:
        channel.close()
        with self._lock:
            self._open -= 1
