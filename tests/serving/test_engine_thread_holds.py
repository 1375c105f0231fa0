"""An engine that holds pending work (`holding_s`: Code2Wav waiting for an announced first
window) sleeps on its command queue instead of stepping in a loop, wakes for a command, and
steps once the hold ends; the `expect` action reaches only an engine that takes it.

Strategy: a scripted engine counts its steps on a real EngineThread; the action goes through a
real StageAdapter over the fake pb_utils."""
from __future__ import annotations

import threading
import time

import numpy as np

from backends.contracts.messages import ACTION_EXPECT, Code2WavRequest, TalkerRequest, expect_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving.engine_thread import EngineThread
from backends.serving.triton_stage import StageAdapter

WAIT_S = 30.0  # a bound for what happens at once; far below the long hold below
LONG_HOLD_S = 600.0


class HoldingEngine:
    """One pending window, held until `hold_until` (monotonic seconds)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_until = time.monotonic() + hold_s
        self.steps = 0
        self.pending = True
        self.decoded = threading.Event()

    def submit(self, request, sink) -> None:
        pass

    def stop(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return self.pending

    def holding_s(self) -> float:
        return max(0.0, self.hold_until - time.monotonic())

    def step(self) -> None:
        self.steps += 1
        if self.holding_s() == 0.0:
            self.pending = False
            self.decoded.set()


class ExpectingEngine(HoldingEngine):
    """An engine that takes first-window announcements (as Code2Wav's does)."""

    def __init__(self) -> None:
        super().__init__(hold_s=0.0)
        self.expected: list[str] = []

    def expect_window(self, request_id: str) -> None:
        self.expected.append(request_id)


def test_a_holding_engine_sleeps_until_its_hold_ends() -> None:
    engine = HoldingEngine(hold_s=0.3)
    thread = EngineThread(engine, "holding")
    try:
        assert engine.decoded.wait(WAIT_S)
        assert time.monotonic() >= engine.hold_until
        assert engine.steps <= 3, f"{engine.steps} steps during a 0.3 s hold: the thread spun"
    finally:
        thread.shutdown()


def test_a_command_wakes_a_holding_engine_thread() -> None:
    """The command runs while the hold has most of its time left: the thread woke for it."""
    engine = HoldingEngine(hold_s=LONG_HOLD_S)
    thread = EngineThread(engine, "holding")
    ran = threading.Event()
    try:
        thread.call(ran.set)
        assert ran.wait(WAIT_S)
        assert engine.holding_s() > LONG_HOLD_S - WAIT_S
        assert not engine.decoded.is_set() and engine.steps <= 3
    finally:
        engine.hold_until = 0.0
        thread.shutdown()


def test_expect_reaches_an_engine_that_takes_it_and_is_refused_by_the_others(pb) -> None:
    engine = ExpectingEngine()
    adapter = StageAdapter(pb, "code2wav", Code2WavRequest, engine)
    try:
        request = pb.request_from_arrays(to_arrays(expect_request("s.e0")))
        adapter.execute([request])
        assert request.sender.done.wait(WAIT_S)
        assert request.sender.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
        deadline = time.monotonic() + WAIT_S
        while not engine.expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.expected == ["s.e0"]
    finally:
        adapter.finalize()
    talker = StageAdapter(pb, "talker", TalkerRequest, HoldingEngine(hold_s=0.0))
    try:
        refused = pb.request_from_arrays(to_arrays(TalkerRequest(
            request_id="s.e0", condition_seq=0, token_ids=np.zeros(1, np.int32),
            hidden=np.zeros((1, 4), np.float32), action=ACTION_EXPECT)))
        talker.execute([refused])
        assert refused.sender.done.wait(WAIT_S)
        [(response, _)] = refused.sender.sent
        assert response.error().code() == pb.TritonError.INVALID_ARG
        assert "ACTION must be one of ['run', 'stop', 'health']" in response.error().message()
    finally:
        talker.finalize()
