"""Answers to refused STARTs, sent off the uplink thread.

A refused START still opened a Triton sequence and holds one of the sequence batcher's slots
until an END ends it. Leaving that END to the client let refused STARTs of clients that never
send it fill every slot, after which new STARTs waited silently in Triton's backlog. So a
refusal first frees the sequence (`Downlink.abandon`: the orchestrator's own END, a round trip
through the very server that calls `SessionManager.handle`, which must therefore not wait for
it) and only then sends the `error` event and the FINAL. Freed before answered: a client that
retries with the same id after the answer opens a new sequence, which that END cannot touch.

The workers are started up front and live as long as the manager: the thread count of the
process (a resource gauge the leak tests watch) does not move with refusals.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

from backends.duplex import events as ev
from backends.duplex.downlink import Downlink

log = logging.getLogger(__name__)

WORKERS = 4  # refusals answered at once; each waits one release round trip


@dataclass(frozen=True, slots=True)
class Refusal:
    downlink: Downlink
    event: ev.ServerEvent
    release: bool  # free the transport's sequence before the answer


class Refusals:
    def __init__(self, workers: int = WORKERS) -> None:
        self._queue: queue.SimpleQueue[Refusal | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a refusal is queued before the workers' stop, or answered here
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"duplex-refusals-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def refuse(self, refusal: Refusal) -> None:
        """Answer now when nothing is to be released (or the workers are gone), else on a
        worker after the release."""
        with self._lock:
            if refusal.release and not self._stopped:
                self._queue.put(refusal)
                return
        _answer(refusal)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Answer what is queued, then stop the workers."""
        with self._lock:
            self._stopped = True
            for _ in self._threads:
                self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _work(self) -> None:
        while (refusal := self._queue.get()) is not None:
            try:
                refusal.downlink.abandon()
            except Exception as exc:  # the slot then waits for Triton's idle timer; answer anyway
                log.warning("releasing the sequence of refused session %s failed: %r", refusal.event.session_id, exc)
            try:
                _answer(refusal)
            except Exception as exc:  # a worker must outlive one broken downlink
                log.warning("answering refused session %s failed: %r", refusal.event.session_id, exc)


def _answer(refusal: Refusal) -> None:
    refusal.downlink.send(refusal.event)
    refusal.downlink.close()
