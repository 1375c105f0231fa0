"""ThinkerEngine work that arrives while a step is on the GPU (EngineThread's in-step drain).

Strategy: the drain is scripted: at given drain calls (one per step) it submits an append,
starts a session or stops one, as the engine thread runs the commands posted during a forward.
The runner's pending step is spied on: the appends of sessions outside the step must be laid
out (mel, encoder, rows) before the step's results are read, and every session's units must
equal the same session served alone. A stop of a session inside the step ends that session
alone and frees its slot; the step's other sessions go on. Real streaming encoder, tiny Qwen3
(tests/stages/thinker_driving.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from thinker_driving import UNIT, Parts, audio_engine, run_idle, serve, tiny_audio_parts

from backends.contracts.messages import ACTION_STOP, ThinkerRequest
from backends.contracts.sink import ListSink
from backends.runner.async_output import PendingStep
from backends.stages.thinker_engine import ThinkerEngine
from backends.thinker.session_state import ThinkerSession

HIDDEN_ATOL = 1e-4  # as tests/stages/test_thinker_engine.py: mixed-batch float32 noise


@pytest.fixture(scope="module")
def parts() -> Parts:
    return tiny_audio_parts()


def _reply(rid: str, seed: int) -> list[ThinkerRequest]:
    """A forced two-unit reply to the initial text (several decode steps), then two units."""
    rng = np.random.default_rng(seed)
    audio = [(0.1 * rng.standard_normal(UNIT)).astype(np.float32) for _ in range(3)]
    first = ThinkerRequest(rid, audio[0], seq=0, initial_user_text="hello there", seed=seed,
                           reply_units=2, reply_tokens_per_unit=3)
    return [first] + [ThinkerRequest(rid, a, seq=k + 1) for k, a in enumerate(audio[1:])]


def _listener(rid: str, count: int) -> list[ThinkerRequest]:
    """Silent units forced to listen, each one step (prefill, forced <|listen|>)."""
    silence = np.zeros(UNIT, dtype=np.float32)
    return [ThinkerRequest(rid, silence, seq=k, seed=3, force_listen=True) for k in range(count)]


class InFlight:
    """The engine thread's drain, scripted per drain call, and a record of every activation:
    (request id, whether a launched step's results were still unread)."""

    def __init__(self, engine: ThinkerEngine, monkeypatch, plan: dict[int, list[Callable[[], None]]]) -> None:
        self.calls = 0
        self.in_flight = False
        self.activations: list[tuple[str, bool]] = []
        self._plan = plan
        engine.attach_in_flight_drain(self._drain)
        launch = engine.runner.launch_step

        def spied_launch(inputs):
            pending = launch(inputs)
            self.in_flight = True
            wait = pending.wait

            def spied_wait():
                self.in_flight = False
                return wait()

            pending.wait = spied_wait
            return pending

        monkeypatch.setattr(engine.runner, "launch_step", spied_launch)
        activate = ThinkerSession.activate

        def spied_activate(session, encoded=None):
            self.activations.append((session.request_id, self.in_flight))
            return activate(session, encoded)

        monkeypatch.setattr(ThinkerSession, "activate", spied_activate)

    def _drain(self) -> None:
        for action in self._plan.get(self.calls, []):
            action()
        self.calls += 1


def _submitter(engine: ThinkerEngine, sinks: dict[str, list[ListSink]]):
    def submit(request: ThinkerRequest) -> Callable[[], None]:
        def action() -> None:
            sink = ListSink()
            sinks.setdefault(request.request_id, []).append(sink)
            engine.submit(request, sink)
        return action
    return submit


def _alone(parts: Parts, requests: list[ThinkerRequest]) -> list:
    engine = audio_engine(parts)
    sinks = serve(engine, requests)
    run_idle(engine)
    return _units(sinks)


def _units(sinks: list[ListSink]) -> list:
    assert all(s.closed and s.error is None and len(s.results) == 1 for s in sinks), \
        [s.error for s in sinks]
    return [s.results[0] for s in sinks]


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.decision, a.unit_index, a.text) == (b.decision, b.unit_index, b.text)
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.tts_hidden, b.tts_hidden, rtol=0, atol=HIDDEN_ATOL)


def test_appends_arriving_in_flight_are_laid_out_in_its_shadow(parts, monkeypatch) -> None:
    replier, listener = _reply("a", 5), _listener("b", 4)
    want = {"a": _alone(parts, replier), "b": _alone(parts, listener)}
    engine, sinks = audio_engine(parts), {}
    submit = _submitter(engine, sinks)
    # b starts in the first forward and sends a unit every other step, always idle by then;
    # a's later units arrive while a decodes its reply, inside the step (queued, not laid out)
    plan = {0: [submit(listener[0])], 1: [submit(replier[1])], 2: [submit(listener[1])],
            3: [submit(replier[2])], 4: [submit(listener[2])], 6: [submit(listener[3])]}
    spy = InFlight(engine, monkeypatch, plan)
    submit(replier[0])()
    run_idle(engine)
    assert spy.calls > max(plan)
    _assert_same(_units(sinks["a"]), want["a"])
    _assert_same(_units(sinks["b"]), want["b"])
    assert [flag for rid, flag in spy.activations if rid == "b"] == [True] * 4
    assert [flag for rid, flag in spy.activations if rid == "a"][:3] == [False] * 3
    assert engine.resource_counts()["runner_requests"] == 2


@pytest.mark.parametrize("stop_at", [2, 4])  # mid-unit; in the step that ends a's first unit
def test_a_stop_in_flight_ends_only_its_session(parts, monkeypatch, caplog, stop_at) -> None:
    first, second = _reply("a", 5), _reply("b", 6)
    want = _alone(parts, second[:2])
    engine, sinks = audio_engine(parts), {}
    submit = _submitter(engine, sinks)
    stop = submit(ThinkerRequest("a", np.zeros(0, np.float32), action=ACTION_STOP))
    InFlight(engine, monkeypatch, {stop_at: [stop, submit(second[1])]})
    free_blocks = engine.runner.num_free_blocks()
    for request in (first[0], second[0]):
        submit(request)()
    run_idle(engine)
    cancelled, answered = sinks["a"]
    assert cancelled.closed and cancelled.error.code == "cancelled" and not cancelled.results
    assert answered.closed and answered.error is None  # the stop itself
    _assert_same(_units(sinks["b"]), want)
    assert not engine.runner.has_request("a") and engine.num_sessions() == 1
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    engine.stop("b")
    assert engine.runner.num_free_blocks() == free_blocks


def test_a_step_that_fails_in_flight_ends_its_sessions_and_no_other(parts, monkeypatch) -> None:
    """A session started inside the step settles the runner's pending step first: the step's
    failure is its sessions' (raised by the engine's own wait), its host part runs once, and
    the new session starts."""
    engine, sinks = audio_engine(parts), {}
    submit = _submitter(engine, sinks)
    listener = _listener("b", 1)
    engine.attach_in_flight_drain(lambda: "b" in sinks or submit(listener[0])())
    finishes: list[int] = []
    launch = engine.runner.launch_step

    def failing_launch(inputs):
        launch(inputs)

        def finish():
            finishes.append(1)
            raise RuntimeError("injected step failure")

        engine.runner._pending = PendingStep(finish)
        return engine.runner._pending

    monkeypatch.setattr(engine.runner, "launch_step", failing_launch)
    submit(_reply("a", 5)[0])()
    engine.step()
    monkeypatch.undo()
    (failed,) = sinks["a"]
    assert failed.error.code == "internal" and "injected step failure" in failed.error.message
    assert finishes == [1] and not engine.runner.has_request("a")
    run_idle(engine)
    assert _units(sinks["b"])[0].unit_index == 0
