"""perf/duplex_levels.py with a fake turn runner (no server): C sessions in flight, every
planned turn either run or reported skipped when the level's budget runs out.

The fake turns meet at a barrier before the first one ends, so "C in flight" and "each worker
took one group" hold however late a loaded machine starts the worker threads; the budget is
measured on a clock that only the fake turns move."""
from __future__ import annotations

import threading
import time

import pytest

import perf.duplex_levels as levels
from perf.duplex_levels import LevelPlan, run_level
from perf.turn import TurnOptions
from perf.workload import ReplyShape, Workload

TURN_S = 0.05
WAIT_S = 30.0  # a bound for threads that are starting, not a timing


class FirstTurnsMeet:
    """Each worker's first turn waits until `workers` first turns are under way."""

    def __init__(self, workers: int) -> None:
        self._barrier = threading.Barrier(workers, timeout=WAIT_S)
        self._met: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            first = threading.get_ident() not in self._met
            self._met.add(threading.get_ident())
        if first:
            self._barrier.wait()


@pytest.fixture
def fake_turns(monkeypatch, record_factory):
    live, peak, lock = [0], [0], threading.Lock()
    meet = FirstTurnsMeet(3)

    def fake_run_turn(spec, voice, options, run_id):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        meet()
        time.sleep(TURN_S)
        with lock:
            live[0] -= 1
        return record_factory(spec.group, spec.turn)

    monkeypatch.setattr(levels, "run_turn", fake_run_turn)
    return peak


class TurnClock:
    """Stands in for duplex_levels' `time`: only the fake turns (and the stagger) move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def workload():
    return Workload.load(ReplyShape())


def test_all_turns_run_with_c_in_flight(fake_turns, workload):
    result = run_level(LevelPlan(3, 6, turns_per_group=2, stagger_s=0.0), workload, TurnOptions("unused:1"), "t")
    assert (result.summary.num_groups, result.summary.num_turns, result.summary.skipped_turns) == (6, 12, 0)
    assert fake_turns[0] == 3
    assert len(result.to_json()["turns"]) == 12


def test_budget_skips_the_rest_and_says_so(monkeypatch, record_factory, workload):
    clock = TurnClock()

    def fake_run_turn(spec, voice, options, run_id):
        clock.sleep(TURN_S)
        return record_factory(spec.group, spec.turn)

    monkeypatch.setattr(levels, "time", clock)
    monkeypatch.setattr(levels, "run_turn", fake_run_turn)
    result = run_level(LevelPlan(1, 4, turns_per_group=4, stagger_s=0.0, budget_s=2.5 * TURN_S), workload,
                       TurnOptions("unused:1"), "t")
    # turns start at 0, 1 and 2 turn lengths; the fourth would start past the budget
    assert result.summary.num_turns == 3
    assert result.summary.skipped_turns == 16 - 3


def test_replicas_share_the_sessions_evenly(monkeypatch, record_factory, workload):
    urls: list[str] = []
    meet = FirstTurnsMeet(4)  # no worker ends a turn before all four took their group

    def fake_run_turn(spec, voice, options, run_id):
        urls.append(options.url)
        meet()
        return record_factory(spec.group, spec.turn)

    monkeypatch.setattr(levels, "run_turn", fake_run_turn)
    replicas = [TurnOptions("a:1"), TurnOptions("b:1")]
    result = run_level(LevelPlan(4, 4, turns_per_group=2, stagger_s=0.0), workload, replicas, "t")
    assert result.summary.num_turns == 8
    assert sorted(set(urls)) == ["a:1", "b:1"]
    assert urls.count("a:1") == urls.count("b:1") == 4
