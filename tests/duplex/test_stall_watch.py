"""StallWatch: a thread counts as stalled only while inside a stage call without an answer;
nested calls of one thread share its clock; leaving the outermost call clears it.

Strategy: a fake clock moved by hand, and generators standing in for stage streams.
"""
from __future__ import annotations

from backends.duplex.stall_watch import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waiting_inside_a_call_is_a_stall_and_answers_reset_it():
    clock = Clock()
    watch = StallWatch(clock)
    stream = watch.watch(iter([1, 2]))
    assert watch.stalled_s() == 0.0  # not started: no call yet
    assert next(stream) == 1
    clock.now = 5.0
    assert watch.stalled_s() == 5.0
    assert next(stream) == 2
    assert watch.stalled_s() == 0.0
    assert list(stream) == [] and watch.stalled_s() == 0.0


def test_a_nested_call_keeps_the_thread_in_a_call_until_the_outer_one_ends():
    clock = Clock()
    watch = StallWatch(clock)
    outer = watch.watch(iter([1, 2]))
    next(outer)
    assert list(watch.watch(iter(["a"]))) == ["a"]
    clock.now = 3.0
    assert watch.stalled_s() == 3.0  # back in the outer call, waiting for its next answer
    outer.close()
    assert watch.stalled_s() == 0.0
