"""Code2Wav behind the stage-engine interface: one sink per window request.

`Code2WavEngine` batches windows and validates (cache_epoch, chunk_seq); this wrapper pairs
each result with the request that asked for it and owns the sinks' lifetimes, so a stopped
request or a failed forward still answers every window with exactly one FINAL.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from backends.contracts.errors import StageError
from backends.contracts.messages import ACTION_STOP, Code2WavAudio, Code2WavRequest
from backends.contracts.sink import ResponseSink
from backends.stages.code2wav_engine import ERROR_INTERNAL, Code2WavEngine, Code2WavResult

log = logging.getLogger(__name__)

WindowKey = tuple[str, int, int]  # (request_id, cache_epoch, chunk_seq)


class Code2WavService:
    def __init__(self, engine: Code2WavEngine) -> None:
        self.engine = engine
        self._sinks: dict[WindowKey, ResponseSink] = {}  # owner: the engine thread

    def submit(self, request: Code2WavRequest, sink: ResponseSink) -> None:
        if request.action == ACTION_STOP:
            self.stop(request.request_id)
            sink.close()
            return
        key = (request.request_id, request.cache_epoch, request.chunk_seq)
        if key in self._sinks:  # a request id may appear once per window (edge case 6)
            sink.close(StageError("invalid_argument", f"window {key} is already in flight"))
            return
        self._sinks[key] = sink
        self.engine.submit(request)
        if request.codes.size == 0 and request.chunk_seq < 0:  # placeholder: nothing to decode
            self._sinks.pop(key).close()

    def stop(self, request_id: str) -> None:
        self.engine.release(request_id)
        for key in [k for k in self._sinks if k[0] == request_id]:
            self._sinks.pop(key).close(StageError("cancelled", f"request {request_id!r} was stopped"))

    def has_work(self) -> bool:
        """Windows to decode or answer; windows that wait for a cache-pool slot wait for a
        stream to end, which a step (its last window) or a STOP (a command) brings."""
        return bool(self._sinks) and self.engine.has_work()

    def expect_window(self, request_id: str) -> None:
        """A reply's first window for `request_id` is on its way (`Code2WavEngine.expect_window`)."""
        self.engine.expect_window(request_id)

    def holding_s(self) -> float:
        """How long the engine thread may sleep although windows are pending (they wait for an
        announced first window); new commands wake it earlier."""
        return self.engine.holding_s()

    def observe_window_waits(self, observer: Callable[[str, float], None]) -> None:
        """Report each window's queueing (`Code2WavEngine.on_window_wait`); before the engine
        thread starts."""
        self.engine.on_window_wait = observer

    def num_states(self) -> int:
        return self.engine.num_states()

    def resource_counts(self) -> dict[str, int]:
        """What the stage holds (leak checks; published as gauges by the serving layer)."""
        return {"requests": len(self._sinks), **self.engine.resource_counts()}

    def step(self) -> None:
        try:
            results = self.engine.step()
        except Exception as exc:  # a failed forward fails the windows in it, not the stage
            log.exception("code2wav forward failed")
            self.abort_all(StageError("internal", f"code2wav forward failed: {type(exc).__name__}: {exc}"))
            return
        for result in results:
            self._deliver(result)

    def _deliver(self, result: Code2WavResult) -> None:
        sink = self._sinks.pop((result.request_id, result.cache_epoch, result.chunk_seq), None)
        if sink is None:  # stopped while in the forward
            return
        if result.error is not None:
            code, _, detail = result.error.partition(": ")
            if code == ERROR_INTERNAL:  # the engine dropped the request: end its other windows too
                self.stop(result.request_id)
            sink.close(StageError("internal" if code == ERROR_INTERNAL else "invalid_argument", f"{code}: {detail}"))
            return
        # one response with FINAL: the caller emits the audio once the FINAL is in
        sink.finish(Code2WavAudio(result.request_id, result.chunk_seq, result.audio))

    def abort_all(self, error: StageError) -> None:
        for key in list(self._sinks):
            self.engine.release(key[0])
            self._sinks.pop(key).close(error)
