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

A stream carries one request at a time (tritonclient 2.51 drops the request id of in-band
errors, so a stream must not carry two at once). It stays open after a call that got its FINAL,
for the next call on its channel (a stream per call cost 1.2-1.3 ms more per stage call on the
2-core CI machine: `perf/bench_stage_calls.py`); a call that ends any other way (an error,
a timeout, a caller that stopped reading) cancels and closes it, so no late answer can reach a
later call. Channels are pooled per stage; a channel that broke is closed instead of returned,
and a stream idle for `stream_idle_s` is closed (an open stream would keep the server's own
gRPC frontend from shutting down).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
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
# An idle stream is closed after this long: above a session's ~1 s between calls to one stage,
# so a lone session keeps reusing its streams, short enough for a prompt shutdown.
DEFAULT_STREAM_IDLE_S = 2.0
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
    """One gRPC channel and at most one open stream on it (see the module docstring); `call`
    sends one request and yields the answers that carry outputs up to the FINAL."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)
        self._answers: queue.SimpleQueue[tuple[Any, Any]] | None = None  # the open stream's
        self.usable = True  # cleared when the channel itself broke
        self.last_used = time.monotonic()

    @property
    def has_stream(self) -> bool:
        return self._answers is not None

    def call(self, model: str, arrays: dict[str, np.ndarray]) -> Iterator[Any]:
        """Results (tritonclient InferResult); raises StageCallError on the stage's error."""
        answers = self._open_stream()
        finished = False
        try:
            self._client.async_stream_infer(model, infer_inputs(arrays), request_id=uuid.uuid4().hex,
                                            enable_empty_final_response=True)
            while True:
                result, error = self._next(model, answers)
                if error is not None:
                    raise StageCallError(model, self._stage_error(model, error))
                response = result.get_response()
                if response.outputs:
                    yield result
                if response.parameters["triton_final_response"].bool_param:
                    finished = True
                    return
        finally:
            self.last_used = time.monotonic()
            if not finished:  # the request may still be live: cancel it with its stream
                self.end_stream()

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

    def end_stream(self) -> None:
        """Cancel and close the open stream, if any (idle, nothing is lost; mid-call, nothing
        more is wanted)."""
        if self._answers is None:
            return
        self._answers = None
        try:
            stop_stream(self._client, cancel=True)
        except Exception as exc:
            log.debug("closing a stage stream failed: %r", exc)
            self.usable = False

    def close(self) -> None:
        self.end_stream()
        try:
            self._client.close()
        except Exception as exc:  # a broken channel: nothing more to free
            log.debug("closing a stage channel failed: %r", exc)


class GrpcStageClients:
    """StageClients (backends/duplex/stage_clients.py) over pooled StageChannels."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_idle: int = DEFAULT_MAX_IDLE,
                 channel_factory: Callable[[str, float], StageChannel] = StageChannel,
                 stream_idle_s: float = DEFAULT_STREAM_IDLE_S) -> None:
        self._url, self._timeout_s, self._max_idle = url, timeout_s, max_idle
        self._new_channel = channel_factory  # tests pass a fake
        self._lock = threading.Lock()  # guards the fields below
        self._idle: dict[str, list[StageChannel]] = {}
        self._open = 0  # channels created and not closed (idle or in a call)
        self._closed = False
        self._stream_idle_s = stream_idle_s
        self._stopping = threading.Event()
        self._closer = threading.Thread(target=self._close_idle_loop, name="stage-stream-closer", daemon=True)
        self._closer.start()

    def open_channels(self) -> int:
        with self._lock:
            return self._open

    def idle_streams(self) -> int:
        """Streams held open by pooled channels between calls."""
        with self._lock:
            return sum(c.has_stream for channels in self._idle.values() for c in channels)

    def close_idle_streams(self, idle_s: float) -> int:
        """Close the streams of pooled channels unused for `idle_s` or more; returns how many."""
        now = time.monotonic()
        with self._lock:  # taken out of the pool meanwhile, so no call can pick them up
            stale = [(model, c) for model, channels in self._idle.items() for c in channels
                     if c.has_stream and now - c.last_used >= idle_s]
            for model, channel in stale:
                self._idle[model].remove(channel)
        for model, channel in stale:
            channel.end_stream()
            self._checkin(model, channel)
        return len(stale)

    def _close_idle_loop(self) -> None:
        period = max(0.05, self._stream_idle_s / 4)
        while not self._stopping.wait(period):
            try:
                self.close_idle_streams(self._stream_idle_s)
            except Exception as exc:  # a stream that fails to close marks its channel unusable
                log.warning("closing idle stage streams failed: %r", exc)

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
        self._stopping.set()
        self._closer.join(5.0)
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
