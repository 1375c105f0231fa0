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

Each call runs on a pooled StageChannel (backends/serving/stage_channel.py: one request at a time
per stream, streams reused across calls, never cancelled). Channels are pooled per stage; a
channel that broke is closed instead of returned, one whose early-ended call is still draining
waits in the pool until its FINAL arrives, and a stream idle for `stream_idle_s` is closed (an
open stream would keep the server's own gRPC frontend from shutting down). Every request carries
the server's stage secret (backends/serving/stage_secret.py), without which the stages refuse it.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, expect_request,
    stop_request,
)
from backends.contracts.stage_clients import CODE2WAV, TALKER, THINKER
from backends.contracts.tensor_codec import from_arrays, to_arrays
from backends.serving.own_server import OwnServerNotFound, own_server_grpc_url
from backends.serving.stage_channel import DEFAULT_CLOSE_WAIT_S, StageChannel

log = logging.getLogger(__name__)

STAGE_URL_ENV = "MINICPMO_STAGE_URL"  # an explicit gRPC host:port of the stages (another server's)
DEFAULT_TIMEOUT_S = 60.0  # a call that hears nothing for this long fails (stage_timeout)
DEFAULT_MAX_IDLE = 16  # idle channels kept per stage; more are closed when their call ends
# (draining ones are kept beyond it: closing one would wait for its request)
# An idle stream is closed after this long: above a session's ~1 s between calls to one stage,
# so a lone session keeps reusing its streams, short enough for a prompt shutdown.
DEFAULT_STREAM_IDLE_S = 2.0
# At close, a draining stream waits this long for its FINAL (each in turn) before it is cancelled.
SHUTDOWN_CLOSE_WAIT_S = 1.0


def stage_url(params: dict[str, str], pid: int | None = None) -> str:
    """The model parameter `stage_url`, else the environment's, else the gRPC address on the
    command line of the tritonserver running this process (backends/serving/own_server.py).
    Where none gives one, ValueError names what to set: `duplex` fails its load with it."""
    explicit = params.get("stage_url") or os.environ.get(STAGE_URL_ENV)
    if explicit:
        return explicit
    try:
        return own_server_grpc_url(os.getpid() if pid is None else pid)
    except OwnServerNotFound as exc:
        raise ValueError(f"duplex cannot find the gRPC address of its own server to call the stages: {exc}; "
                         f"set {STAGE_URL_ENV}=HOST:PORT in the server's environment or the `stage_url` "
                         f"parameter of model_repository/duplex/config.pbtxt") from exc


class GrpcStageClients:
    """StageClients (backends/contracts/stage_clients.py) over pooled StageChannels."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_idle: int = DEFAULT_MAX_IDLE,
                 channel_factory: Callable[[str, float], StageChannel] | None = None,
                 stream_idle_s: float = DEFAULT_STREAM_IDLE_S, secret: str | None = None) -> None:
        self._url, self._timeout_s, self._max_idle = url, timeout_s, max_idle
        # tests pass a fake factory; the real channels send `secret` on every request
        self._new_channel = channel_factory or functools.partial(StageChannel, secret=secret)
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

    def draining_streams(self) -> int:
        """Pooled channels whose early-ended call's FINAL has not arrived yet."""
        with self._lock:
            return sum(c.draining for channels in self._idle.values() for c in channels)

    def pool_gauges(self) -> dict[str, int]:
        """The resource gauges of the pool (backends/serving/resource_gauges.py)."""
        return {"stage_channels": self.open_channels(), "stage_idle_streams": self.idle_streams(),
                "stage_draining_streams": self.draining_streams()}

    def close_idle_streams(self, idle_s: float) -> int:
        """Close the streams of pooled channels unused for `idle_s` or more, and of draining ones
        whose request outlived the stage timeout; returns how many."""
        now = time.monotonic()
        with self._lock:  # taken out of the pool meanwhile, so no call can pick them up
            stale = [(model, c) for model, channels in self._idle.items() for c in channels
                     if self._stale(c, now, idle_s)]
            for model, channel in stale:
                self._idle[model].remove(channel)
        for model, channel in stale:
            channel.end_stream()
            self._checkin(model, channel)
        return len(stale)

    def _stale(self, channel: StageChannel, now: float, idle_s: float) -> bool:
        if not channel.has_stream:
            return False
        ready = channel.ready()  # reads a draining channel's late answers
        return not channel.usable or now - channel.last_used >= (idle_s if ready else self._timeout_s)

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

    def expect_window(self, request_id: str) -> None:
        channel = self._checkout(CODE2WAV)
        try:
            channel.post(CODE2WAV, to_arrays(expect_request(request_id)))
        finally:
            self._checkin(CODE2WAV, channel)

    def close(self) -> None:
        """Close the idle channels; channels in use close when their calls end."""
        self._stopping.set()
        self._closer.join(5.0)
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for channel in (c for channels in idle.values() for c in channels):
            self._close(channel, SHUTDOWN_CLOSE_WAIT_S)

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
            idle = self._idle.get(model, [])
            for index in range(len(idle) - 1, -1, -1):  # the most recently used first
                if idle[index].ready():
                    return idle.pop(index)
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
            if channel.usable and not self._closed and (len(idle) < self._max_idle or channel.draining):
                idle.append(channel)
                return
        self._close(channel)

    def _close(self, channel: StageChannel, wait_s: float = DEFAULT_CLOSE_WAIT_S) -> None:
        channel.close(wait_s)
        with self._lock:
            self._open -= 1
