"""An engine that takes `attach_in_flight_drain` runs, from inside its step, the commands
posted while the step was under way; a shutdown met there waits for the step to end, and the
commands after it never run. An engine that does not take it (the Talker's, Code2Wav's) has
its commands wait for the step to end.

Strategy: a scripted engine whose one step blocks until the test has posted commands, then
drains, on a real EngineThread."""
from __future__ import annotations

import threading

from backends.serving.engine_thread import EngineThread

WAIT_S = 30.0  # a bound for what happens at once


class DrainingEngine:
    def __init__(self) -> None:
        self.drain = None
        self.pending = True
        self.stepping = False
        self.started = threading.Event()
        self.release = threading.Event()
        self.stepped = threading.Event()
        self.log: list[tuple[str, bool]] = []  # (command, ran inside a step)

    def attach_in_flight_drain(self, drain) -> None:
        self.drain = drain

    def submit(self, request, sink) -> None:
        pass

    def stop(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return self.pending

    def record(self, name: str) -> None:
        self.log.append((name, self.stepping))

    def step(self) -> None:
        self.stepping = True
        self.started.set()
        assert self.release.wait(WAIT_S)
        if self.drain is not None:
            self.drain()
        self.log.append(("step ends", True))
        self.stepping = self.pending = False
        self.stepped.set()


def test_commands_posted_during_a_step_run_inside_it() -> None:
    engine = DrainingEngine()
    thread = EngineThread(engine, "draining")
    assert engine.drain is not None
    assert engine.started.wait(WAIT_S)
    thread.call(engine.record, "first")
    thread.call(engine.record, "second")
    engine.release.set()
    assert engine.stepped.wait(WAIT_S)
    thread.call(engine.record, "after")
    thread.shutdown(WAIT_S)
    assert engine.log[:3] == [("first", True), ("second", True), ("step ends", True)]
    assert engine.log[3:] == [("after", False)]


def test_a_shutdown_met_inside_a_step_is_held_until_it_ends() -> None:
    engine = DrainingEngine()
    thread = EngineThread(engine, "draining")
    assert engine.started.wait(WAIT_S)
    thread.call(engine.record, "before")
    thread.shutdown(timeout_s=0.0)  # posts the stop, does not wait
    thread.call(engine.record, "never")
    engine.release.set()
    thread._thread.join(WAIT_S)
    assert not thread.is_alive()
    assert engine.log == [("before", True), ("step ends", True)]


class SteppingEngine(DrainingEngine):
    """Steps as the draining engine does, but offers no in-step drain."""

    attach_in_flight_drain = None  # type: ignore[assignment]


def test_without_the_drain_the_commands_wait_for_the_step() -> None:
    engine = SteppingEngine()
    thread = EngineThread(engine, "not-draining")
    assert engine.drain is None
    assert engine.started.wait(WAIT_S)
    thread.call(engine.record, "posted")
    engine.release.set()
    assert engine.stepped.wait(WAIT_S)
    thread.shutdown(WAIT_S)
    assert engine.log == [("step ends", True), ("posted", False)]

