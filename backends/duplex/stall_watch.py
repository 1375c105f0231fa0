"""How long a session's worker loops have waited on a stage without an answer.

A stage call can go quiet: a stage whose engine is stuck, or a request whose FINAL never
arrives, leaves the calling thread waiting on its answers, which cannot be interrupted, and the
stage transport's own timeout may be longer than the session's. `WatchedStages` wraps a session's StageClients and
records, per calling thread, when it last got anything from a stage while inside a call; the
reaper closes a session stalled longer than its stage timeout with an `error`, so the client
hears about it and the session's slot and stage state are freed (backends/duplex/session.py).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from backends.contracts.messages import Code2WavAudio, Code2WavRequest, TalkerRequest, ThinkerRequest
from backends.contracts.stage_clients import StageClients

T = TypeVar("T")


class StallWatch:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # the session's two loops and the reaper
        self._progress: dict[int, float] = {}  # thread id -> last answer (or call start)
        self._depth: dict[int, int] = {}  # thread id -> nested calls in progress

    def stalled_s(self) -> float:
        """The longest wait of a thread inside a stage call without an answer; 0 when none."""
        now = self._clock()
        with self._lock:
            return max((now - t for t in self._progress.values()), default=0.0)

    def watch(self, items: Iterable[T]) -> Iterator[T]:
        key = threading.get_ident()
        self._enter(key)
        try:
            for item in items:
                self._touch(key)
                yield item
                self._touch(key)  # the consumer's own work between answers is not a stall
        finally:
            self._leave(key)

    def _enter(self, key: int) -> None:
        with self._lock:
            self._depth[key] = self._depth.get(key, 0) + 1
            self._progress[key] = self._clock()

    def _touch(self, key: int) -> None:
        with self._lock:
            self._progress[key] = self._clock()

    def _leave(self, key: int) -> None:
        with self._lock:
            self._depth[key] -= 1
            if self._depth[key]:
                self._progress[key] = self._clock()
            else:
                del self._depth[key], self._progress[key]


class WatchedStages:
    """StageClients whose calls report their progress to a StallWatch (stops pass through)."""

    def __init__(self, stages: StageClients, watch: StallWatch) -> None:
        self._stages, self._watch = stages, watch

    def thinker(self, request: ThinkerRequest) -> Iterator[Any]:
        return self._watch.watch(_deferred(self._stages.thinker, request))

    def talker(self, request: TalkerRequest) -> Iterator[Any]:
        return self._watch.watch(_deferred(self._stages.talker, request))

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        return list(self._watch.watch(_deferred(self._stages.code2wav, request)))

    def stop(self, stage: str, request_id: str) -> None:
        self._stages.stop(stage, request_id)

    def expect_window(self, request_id: str) -> None:
        self._stages.expect_window(request_id)


def _deferred(call: Callable[[Any], Iterable[T]], request: Any) -> Iterator[T]:
    """Make the call on the first `next()`, inside the watch (a call such as `code2wav` blocks
    before it returns)."""
    yield from call(request)
