"""UplinkPace: how far ahead of real time and of the model a session's uplink may run.

Strategy: a fake clock drives the bucket; `waiting` stands in for the audio the Thinker has
not taken. Each rule of the module docstring gets a case that passes and one that is refused,
and a refused append must leave the bucket as it was.
"""
from __future__ import annotations

import pytest

from backends.duplex.errors import DuplexError
from backends.duplex.uplink_pace import UplinkPace

SECOND = 16000
APPEND = 3200  # 200 ms


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def _flood(pace: UplinkPace, appends: int, waiting_of=lambda sent: sent) -> int:
    """Appends of 200 ms at one instant; returns how many were accepted."""
    sent = 0
    for _ in range(appends):
        try:
            pace.admit(APPEND, waiting_of(sent))
        except DuplexError as exc:
            assert exc.code == "resource_exhausted" and "ahead of real time" in exc.message
            continue
        sent += APPEND
    return sent // APPEND


def test_a_burst_of_the_bound_is_accepted_and_no_more(clock):
    pace = UplinkPace(5.0, clock)
    assert _flood(pace, 40) == 25  # 5 s at once (the minimal client of docs/duplex_contract.md)


def test_real_time_is_never_refused_however_far_the_model_lags(clock):
    pace = UplinkPace(5.0, clock)
    for index in range(500):  # 100 s in real time; the model has taken nothing
        pace.admit(APPEND, waiting=index * APPEND)
        clock.now += 0.2


def test_a_pause_earns_no_credit(clock):
    pace = UplinkPace(5.0, clock)
    pace.admit(APPEND, 0)
    clock.now += 120.0
    assert _flood(pace, 40) == 25


def test_real_time_drains_the_bucket(clock):
    pace = UplinkPace(5.0, clock)
    assert _flood(pace, 25) == 25
    clock.now += 1.0
    assert _flood(pace, 40, waiting_of=lambda sent: 5 * SECOND + sent) == 5  # one second later: one more


def test_a_model_that_keeps_up_lets_the_client_run_faster_than_real_time(clock):
    pace = UplinkPace(5.0, clock)
    assert _flood(pace, 200, waiting_of=lambda sent: 0) == 200  # 40 s at once, all taken at once


def test_a_refused_append_changes_nothing(clock):
    pace = UplinkPace(5.0, clock)
    pace.admit(5 * SECOND, 5 * SECOND)
    with pytest.raises(DuplexError):
        pace.admit(APPEND, 5 * SECOND)
    clock.now += 0.2
    pace.admit(APPEND, 5 * SECOND)  # 200 ms drained: exactly room for 200 ms


def test_one_append_longer_than_the_bound_is_invalid(clock):
    pace = UplinkPace(5.0, clock)
    with pytest.raises(DuplexError) as info:
        pace.admit(5 * SECOND + 1, 0)
    assert info.value.code == "invalid_argument" and "longer than the uplink bound" in info.value.message
    pace.admit(5 * SECOND, 0)
