"""Pauses of the soaked server's stub processes: every `every_s` seconds one stub, drawn at
random, is stopped with SIGSTOP for `pause_s` seconds and continued.

A whole stub process standing still for a second while the server hands it a request used to
abort Triton 2.51 (docs/triton_behaviours.md#server-deaths); a saturated or briefly frozen
machine does that by itself, rarely. The soak makes it happen on purpose, under load, so its
verdict covers that path: sessions may wait out a pause, but no server may die and no stub may
be restarted. A stub is always continued, also when the soak ends during its pause.
"""
from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from perf.soak_processes import stub_models


@dataclass
class PauseTally:
    pauses: int = 0
    by_model: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"pauses": self.pauses, "by_model": dict(sorted(self.by_model.items())),
                "failures": list(self.failures)}


class StubPauser:
    def __init__(self, every_s: float, pause_s: float, seed: int = 0) -> None:
        if every_s <= pause_s or pause_s <= 0:
            raise ValueError(f"stub pauses need 0 < pause ({pause_s}) < period ({every_s})")
        self._every_s, self._pause_s, self._rng = every_s, pause_s, random.Random(seed)
        self.server_pid: Callable[[], int | None] = lambda: None  # set by the soak: its server now
        self.tally = PauseTally()

    def describe(self) -> str:
        return f"a stub paused {self._pause_s:g} s every {self._every_s:g} s"

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._every_s - self._pause_s):
            self._pause_one(stop)

    def _pause_one(self, stop: threading.Event) -> None:
        server = self.server_pid()
        stubs = stub_models(server) if server else {}
        if not stubs:  # between a death and a restart: nothing to pause
            return
        pid = self._rng.choice(sorted(stubs))
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        try:
            stop.wait(self._pause_s)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                self.tally.failures.append(f"stub {pid} ({stubs[pid]}) was gone when it was to be continued")
        self.tally.pauses += 1
        self.tally.by_model[stubs[pid]] += 1
