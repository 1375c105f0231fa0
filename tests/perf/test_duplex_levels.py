"""perf/duplex_levels.py with a fake turn runner (no server): C sessions in flight, every
planned turn either run or reported skipped when the level's budget runs out."""
from __future__ import annotations

import threading
import time

import pytest

import perf.duplex_levels as levels
from perf.duplex_levels import LevelPlan, run_level
from perf.turn import TurnOptions
from perf.workload import ReplyShape, Workload

TURN_S = 0.05


@pytest.fixture
def fake_turns(monkeypatch, record_factory):
    live, peak, lock = [0], [0], threading.Lock()

    def fake_run_turn(spec, voice, options, run_id):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(TURN_S)
        with lock:
            live[0] -= 1
        return record_factory(spec.group, spec.turn)

    monkeypatch.setattr(levels, "run_turn", fake_run_turn)
    return peak


@pytest.fixture(scope="module")
def workload():
    return Workload.load(ReplyShape())


def test_all_turns_run_with_c_in_flight(fake_turns, workload):
    result = run_level(LevelPlan(3, 6, turns_per_group=2, stagger_s=0.0), workload, TurnOptions("unused:1"), "t")
    assert (result.summary.num_groups, result.summary.num_turns, result.summary.skipped_turns) == (6, 12, 0)
    assert fake_turns[0] == 3
    assert len(result.to_json()["turns"]) == 12


def test_budget_skips_the_rest_and_says_so(fake_turns, workload):
    result = run_level(LevelPlan(1, 4, turns_per_group=4, stagger_s=0.0, budget_s=2.5 * TURN_S), workload,
                       TurnOptions("unused:1"), "t")
    # turns start at 0, 1 and 2 turn lengths; a slow machine stretches the sleeps, so fewer may fit
    assert 1 <= result.summary.num_turns <= 3
    assert result.summary.skipped_turns == 16 - result.summary.num_turns


def test_replicas_share_the_sessions_evenly(monkeypatch, record_factory, workload):
    urls: list[str] = []

    def fake_run_turn(spec, voice, options, run_id):
        urls.append(options.url)
        time.sleep(TURN_S)  # every worker gets one group
        return record_factory(spec.group, spec.turn)

    monkeypatch.setattr(levels, "run_turn", fake_run_turn)
    replicas = [TurnOptions("a:1"), TurnOptions("b:1")]
    result = run_level(LevelPlan(4, 4, turns_per_group=2, stagger_s=0.0), workload, replicas, "t")
    assert result.summary.num_turns == 8
    assert sorted(set(urls)) == ["a:1", "b:1"]
    assert urls.count("a:1") == urls.count("b:1") == 4
