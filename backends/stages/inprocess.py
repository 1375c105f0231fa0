"""StageClients over engines in this process: the orchestrator without a server.

Each engine gets its own EngineThread, exactly as in a stage model, so tests and tools
exercise the same threading as the server minus the IPC.
"""
from __future__ import annotations

import queue
from typing import Any, Iterator

from backends.duplex.stage_clients import CODE2WAV, TALKER, THINKER, StageCallError
from backends.serving.engine_thread import EngineThread, SteppedEngine
from backends.stages.contracts import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult,
)
from backends.stages.sink import StageError

_END = object()


class QueueSink:
    """A ResponseSink that a caller thread iterates."""

    def __init__(self, stage: str, timeout_s: float) -> None:
        self._stage, self._timeout_s = stage, timeout_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False

    def send(self, result: Any) -> None:
        if self._closed:
            raise RuntimeError("send after close")
        self._queue.put(result)

    def close(self, error: StageError | None = None) -> None:
        if self._closed:
            raise RuntimeError("sink closed twice")
        self._closed = True
        self._queue.put(_END if error is None else error)

    def finish(self, result: Any) -> None:
        self.send(result)
        self.close()

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                item = self._queue.get(timeout=self._timeout_s)
            except queue.Empty:
                raise StageCallError(self._stage, StageError("timeout", f"no answer in {self._timeout_s} s")) from None
            if item is _END:
                return
            if isinstance(item, StageError):
                raise StageCallError(self._stage, item)
            yield item


class InProcessStages:
    def __init__(self, thinker: SteppedEngine, talker: SteppedEngine, code2wav: SteppedEngine,
                 timeout_s: float = 60.0) -> None:
        self.threads = {THINKER: EngineThread(thinker, "thinker"), TALKER: EngineThread(talker, "talker"),
                        CODE2WAV: EngineThread(code2wav, "code2wav")}
        self._timeout_s = timeout_s

    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]:
        return self._call(THINKER, request)

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]:
        return self._call(TALKER, request)

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        return list(self._call(CODE2WAV, request))

    def stop(self, stage: str, request_id: str) -> None:
        self.threads[stage].stop_request(request_id)

    def expect_window(self, request_id: str) -> None:
        expect = getattr(self.threads[CODE2WAV].engine, "expect_window", None)
        if expect is not None:  # an engine without first-window holds ignores the hint
            self.threads[CODE2WAV].call(expect, request_id)

    def _call(self, stage: str, request: Any) -> Iterator[Any]:
        sink = QueueSink(stage, self._timeout_s)
        self.threads[stage].submit(request, sink)
        return iter(sink)

    def shutdown(self) -> None:
        for thread in self.threads.values():
            thread.shutdown()
