"""Stage metrics: step times, inbox waits and KV blocks from a real EngineThread over a
scripted engine, error counts through the metered sink, all applied by the one MetricsThread.

Strategy: a scripted engine with a known number of steps and known resource counts runs on
a real EngineThread; after shutdown the fake metric API must hold exactly one step-time
observation per step, the final KV-in-use value, one inbox wait per submitted request (a
request posted during a held step waits at least as long as the step is held) and one error
per failed request. The resource gauges (another writer of the process) must also run on the
metrics thread.
"""
from __future__ import annotations

import threading
import time

import pytest

from backends.contracts.errors import StageError
from backends.contracts.sink import ListSink
from backends.serving.engine_thread import EngineThread
from backends.serving.metrics_catalog import ERRORS, INBOX_WAIT, KV_BLOCKS_IN_USE, STEP_TIME, WINDOW_WAIT
from backends.serving.metrics_stage import StageMetrics
from backends.serving.metrics_thread import MetricsThread
from backends.serving.resource_gauges import ResourceGauges

STEP_S = 0.01
# Timer resolution and scheduling on a loaded 2-core CI box: a step is never measured shorter
# than it slept; longer is fine.
STEP_LOWER_BOUND_MS = 1000.0 * STEP_S * 0.9
BLOCKS = 64
BLOCKS_PER_REQUEST = 8


class ScriptedEngine:
    """Each submitted request holds BLOCKS_PER_REQUEST blocks for `steps` steps."""

    def __init__(self) -> None:
        self.live: dict[str, list] = {}  # request_id -> [steps left, sink]
        self.steps = 0

    def submit(self, request: tuple[str, int], sink) -> None:
        self.live[request[0]] = [request[1], sink]

    def stop(self, request_id: str) -> None:
        entry = self.live.pop(request_id, None)
        if entry is not None:
            entry[1].close(StageError("cancelled", "stopped"))

    def has_work(self) -> bool:
        return bool(self.live)

    def step(self) -> None:
        time.sleep(STEP_S)
        self.steps += 1
        for rid, entry in list(self.live.items()):
            entry[0] -= 1
            if entry[0] == 0:
                del self.live[rid]
                entry[1].close()

    def resource_counts(self) -> dict[str, int]:
        return {"requests": len(self.live), "kv_blocks": BLOCKS,
                "kv_free_blocks": BLOCKS - BLOCKS_PER_REQUEST * len(self.live)}


class HeldEngine(ScriptedEngine):
    """Each step signals `stepping`, then runs only once `release` is set (set once: the
    first step is held, the later ones run at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.stepping, self.release = threading.Event(), threading.Event()

    def step(self) -> None:
        self.stepping.set()
        assert self.release.wait(10), "the test never released the step"
        super().step()


def _run(pb, script, engine: ScriptedEngine | None = None
         ) -> tuple[ScriptedEngine, StageMetrics, list[ListSink]]:
    engine = engine or ScriptedEngine()
    stage = StageMetrics(MetricsThread(pb, "talker", "talker_0_0"), ResourceGauges(pb, "talker"))
    thread = EngineThread(engine, "test-engine", observer=lambda: stage.publish(engine.resource_counts()),
                          on_step=stage.on_step, on_inbox_wait=stage.on_inbox_wait)
    sinks = script(thread, stage)
    deadline = time.monotonic() + 10
    while any(not s.closed for s in sinks) and time.monotonic() < deadline:
        time.sleep(0.005)
    thread.shutdown()
    stage.shutdown()
    return engine, stage, sinks


def test_each_step_is_timed_and_kv_in_use_follows_the_engine(pb):
    def script(thread, stage):
        sinks = [ListSink(), ListSink()]
        posted = threading.Event()
        thread.call(posted.wait, 10)  # the engine thread takes both before its first step
        thread.submit(("a", 3), stage.sink(sinks[0]))
        thread.submit(("b", 5), stage.sink(sinks[1]))
        posted.set()
        return sinks

    engine, _, sinks = _run(pb, script)
    steps = pb.observed(STEP_TIME.name, model="talker")
    assert len(steps) == engine.steps == 5
    assert min(steps) >= STEP_LOWER_BOUND_MS
    assert pb.value(KV_BLOCKS_IN_USE.name, model="talker") == 0.0, "both requests ended"
    sets = [op for op, name, _ in pb.metric_calls if name == KV_BLOCKS_IN_USE.name and op == "set"]
    assert 2 <= len(sets) <= 4, "set on change only (16 -> 8 -> 0, plus the first round)"
    assert pb.value("minicpmo_requests", model="talker") == 0.0, "the resource gauges ran too"
    assert all(s.error is None for s in sinks)
    api_threads = {tid for _, _, tid in pb.metric_calls}
    assert len(api_threads) == 1 and threading.get_ident() not in api_threads


def test_failed_requests_count_by_code_once(pb):
    def script(thread, stage):
        sinks = [ListSink(), ListSink()]
        thread.submit(("long", 10_000), stage.sink(sinks[0]))
        thread.stop_request("long")
        metered = stage.sink(sinks[1])
        metered.close(StageError("invalid_argument", "bad"))
        with pytest.raises(RuntimeError):
            metered.close(StageError("invalid_argument", "again"))  # ListSink refuses a 2nd close
        stage.count_error("internal")
        return sinks

    _, _, sinks = _run(pb, script)
    assert sinks[0].error == StageError("cancelled", "stopped")
    assert pb.value(ERRORS.name, code="cancelled", channel="response") == 1
    assert pb.value(ERRORS.name, code="invalid_argument", channel="response") == 1
    assert pb.value(ERRORS.name, code="internal") == 1


def test_window_waits_are_observed_by_kind(pb):
    def script(thread, stage):
        stage.on_window_wait("first", 0.012)
        stage.on_window_wait("later", 0.3)
        return []

    _run(pb, script)
    assert pb.observed(WINDOW_WAIT.name, kind="first") == [12.0]
    assert pb.observed(WINDOW_WAIT.name, kind="later") == [300.0]


HELD_S = 0.03


def test_a_request_posted_during_a_step_waits_for_it_in_the_inbox(pb):
    engine = HeldEngine()
    before_step_ms: list[float] = []

    def script(thread, stage):
        sinks = [ListSink(), ListSink()]
        posted = time.perf_counter()
        thread.submit(("a", 2), stage.sink(sinks[0]))
        assert engine.stepping.wait(10)
        before_step_ms.append(1000.0 * (time.perf_counter() - posted))
        thread.submit(("b", 1), stage.sink(sinks[1]))  # posted while "a"'s first step runs
        time.sleep(HELD_S)
        engine.release.set()
        return sinks

    _run(pb, script, engine)
    waits = pb.observed(INBOX_WAIT.name, model="talker")
    assert len(waits) == 2, "one wait per submitted request"
    assert waits[0] <= before_step_ms[0], (waits, before_step_ms)  # "a" was taken before its step
    assert waits[1] >= 1000.0 * HELD_S * 0.9, waits  # never shorter than the step was held
