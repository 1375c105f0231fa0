"""SessionManager + Session with scripted stages: event order, one FINAL, admission, routing,
barge-in fencing, idle reaping, and fault containment, all without a server."""
from __future__ import annotations

import numpy as np
import pytest
from scripted_stages import ScriptedStages, send, wait_finished, wait_for

from backends.duplex.session_manager import ManagerConfig, SessionManager


@pytest.fixture
def stages():
    return ScriptedStages()


def _converse(manager, sid, units=4):
    down, _ = send(manager, sid, start=True, initial_user_text="hi")
    for _ in range(units):
        _, reply = send(manager, sid, 16000)
        assert reply.result == "ok"
    wait_for(lambda: "response.done" in down.types(), "response.done")
    send(manager, sid, end=True)
    wait_for(down.closed.is_set, "downlink FINAL")
    return down


def _converse_alone(manager, sid, units=4):
    """A whole conversation on a manager with no other session, until the manager forgets it."""
    down = _converse(manager, sid, units)
    wait_finished(manager, down, "downlink FINAL")
    return down


def test_conversation_events_in_order_and_one_final(stages):
    manager = SessionManager(ManagerConfig(), stages)
    down = _converse_alone(manager, "s1")
    types = down.types()
    assert types[0] == "session.created" and types[-1] == "session.closed"
    assert types.count("response.done") == 1 and types.count("session.closed") == 1
    order = [t for t in types if t.startswith("response.") and t not in ("response.listen", "response.text.delta")]
    assert order[:2] == ["response.created", "response.speak"] and order[-1] == "response.done"
    deltas = [e for e in down.events if e.type == "response.audio.delta"]
    assert sum(e.audio.size for e in deltas) == 2 * 25 * 960 and all(e.audio.dtype == np.int16 for e in deltas)
    assert "ttfp_ms" in deltas[0].fields and "ttfp_ms" not in deltas[-1].fields
    done = next(e for e in down.events if e.type == "response.done")
    assert done.fields["status"] == "completed" and done.fields["audio_ms"] == 2000.0
    assert manager.num_sessions == 0


def test_admission_limit_refuses_at_start_and_frees_on_close(stages):
    manager = SessionManager(ManagerConfig(max_sessions=1), stages)
    first, _ = send(manager, "a", start=True)
    refused, _ = send(manager, "b", start=True)
    wait_for(refused.closed.is_set, "the refusal")
    assert refused.events[0].fields["code"] == "resource_exhausted" and refused.abandoned
    send(manager, "a", end=True)
    wait_finished(manager, first, "first session closed")
    again, _ = send(manager, "b", start=True)
    assert not again.closed.is_set() and again.types() == ["session.created"]


def test_unknown_session_and_duplicate_start(stages):
    manager = SessionManager(ManagerConfig(), stages)
    _, reply = send(manager, "ghost", 1600)
    assert reply.result.code == "session_not_found"
    send(manager, "s", start=True)
    dup, _ = send(manager, "s", start=True)
    assert dup.events[0].fields["code"] == "session_exists" and dup.closed.is_set()


def test_bad_append_fails_the_request_and_keeps_the_session(stages):
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    _, reply = send(manager, "s", 1600, sample_rate=8000)
    assert reply.result.code == "invalid_argument" and "sample_rate" in reply.result.message
    assert down.events[-1].type == "error" and not down.closed.is_set()
    for _ in range(3):
        send(manager, "s", 16000)
    wait_for(lambda: "response.done" in down.types(), "response after a bad request")


def test_two_sessions_never_see_each_others_events():
    stages = ScriptedStages()
    manager = SessionManager(ManagerConfig(), stages)
    downs = {sid: send(manager, sid, start=True)[0] for sid in ("x", "y")}
    for _ in range(3):
        for sid in downs:
            send(manager, sid, 16000)
    for sid, down in downs.items():
        wait_for(lambda d=down: "response.done" in d.types(), f"{sid} done")
        assert {e.session_id for e in down.events} == {sid}


def test_cancel_ends_the_response_and_fences_old_audio():
    stages = ScriptedStages(speak_from=0, reply_units=3)
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_for(lambda: "response.audio.delta" in down.types(), "first audio")
    send(manager, "s", action="cancel")
    wait_for(lambda: "response.done" in down.types(), "cancel done")
    done_at = down.types().index("response.done")
    assert down.events[done_at].fields["status"] == "cancelled"
    assert ("talker", "s.e0") in stages.stops and ("thinker", "s.e0") in stages.stops
    send(manager, "s", 16000)  # the new epoch restarts the Thinker request from seq 0
    wait_for(lambda: any(getattr(r, "request_id", "") == "s.e1" for r in stages.requests), "new epoch")
    old_audio_after = [e for e in down.events[done_at:] if e.type == "response.audio.delta"
                       and e.fields["response_id"] == down.events[done_at].fields["response_id"]]
    assert old_audio_after == []


def test_idle_session_is_reaped_with_reason_idle(stages):
    manager = SessionManager(ManagerConfig(idle_timeout_s=0.3), stages)
    down, _ = send(manager, "s", start=True)
    wait_finished(manager, down, "idle reap")
    assert down.events[-1].type == "session.closed" and down.events[-1].fields["reason"] == "idle"
    assert manager.num_sessions == 0 and ("thinker", "s.e0") in stages.stops


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
def test_stage_fault_ends_only_that_session(stage):
    stages = ScriptedStages()
    manager = SessionManager(ManagerConfig(), stages)
    stages.fail_on[stage] = 1 if stage == "thinker" else 1
    bad, _ = send(manager, "bad", start=True)
    send(manager, "bad", 16000 * 3)
    wait_for(bad.closed.is_set, "failed session closed")
    assert "error" in bad.types() and bad.types()[-1] == "session.closed"
    good = _converse(manager, "good")
    assert "error" not in good.types()


def test_multi_unit_appends_when_allowed_and_force_listen_never_mixes():
    from backends.duplex.session import SessionConfig

    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()  # hold the Thinker so that units queue up
    # Six seconds queue ahead of the held Thinker: past the default uplink bound of 5 s.
    manager = SessionManager(ManagerConfig(session=SessionConfig(max_units_per_append=4, max_uplink_ahead_s=6)),
                             stages)
    down, _ = send(manager, "s", start=True, force_listen_count=2)
    for _ in range(6):
        send(manager, "s", 16000)
    stages.gate.set()
    wait_for(lambda: sum(stages.units_seen.values()) == 6, "all six units decided")
    appends = [r for r in stages.requests if hasattr(r, "force_listen") and r.audio.size]  # not the setup
    sizes = [r.audio.size // 16000 for r in appends]
    flags = [r.force_listen for r in appends]
    assert sum(sizes) == 6 and max(sizes) > 1, sizes
    assert flags[0] and not flags[-1] and sizes[0] <= 2
    assert all(f == (i < flags.count(True)) for i, f in enumerate(flags))


def test_each_epoch_sends_its_setup_before_its_first_unit():
    """Seq 0 goes out alone at START (the Thinker prefills the context while the first unit
    is still being spoken), and again right after a barge-in for the new epoch."""
    stages = ScriptedStages(speak_from=99)
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True, instructions="be brief", initial_user_text="hi")
    wait_for(lambda: len(stages.requests) == 1, "the setup append")
    setup = stages.requests[0]
    assert (setup.seq, setup.audio.size, setup.instructions, setup.initial_user_text) == (0, 0, "be brief", "hi")
    send(manager, "s", 16000)
    wait_for(lambda: stages.units_seen["s.e0"] == 1, "the first unit")
    unit = stages.requests[1]
    assert (unit.seq, unit.audio.size, unit.instructions, unit.initial_user_text) == (1, 16000, "", "")
    send(manager, "s", action="cancel")
    send(manager, "s", 16000)
    wait_for(lambda: stages.units_seen["s.e1"] == 1, "the first unit of epoch 1")
    epoch1 = [r for r in stages.requests if getattr(r, "request_id", "") == "s.e1"]
    assert [(r.seq, r.audio.size) for r in epoch1] == [(0, 0), (1, 16000)]
    assert epoch1[0].instructions == "be brief" and epoch1[0].initial_user_text == ""
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "downlink FINAL")


def test_moved_downlink_carries_every_later_event_and_the_final(stages):
    manager = SessionManager(ManagerConfig(), stages)
    first, _ = send(manager, "s", start=True, initial_user_text="hi")
    wait_for(lambda: "session.created" in first.types(), "session.created")
    second, reply = send(manager, "s", action="move_downlink")
    assert reply.result is None, "a move is answered by the session's events, not an empty FINAL"
    assert first.closed.is_set() and first.types()[-1] == "downlink.moved"
    for _ in range(4):
        send(manager, "s", 16000)
    third, _ = send(manager, "s", action="move_downlink")
    send(manager, "s", end=True)
    wait_finished(manager, third, "downlink FINAL on the last move")
    assert second.types()[-1] == "downlink.moved" and second.closed.is_set()
    assert third.types()[-1] == "session.closed" and "session.created" not in second.types() + third.types()
    deltas = [e for d in (first, second, third) for e in d.events if e.type == "response.audio.delta"]
    assert sum(e.audio.size for e in deltas) == 2 * 25 * 960


@pytest.mark.parametrize("flags, samples", [({"end": True}, 0), ({}, 1600)])
def test_bad_move_fails_the_request_and_keeps_the_downlink(stages, flags, samples):
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    _, reply = send(manager, "s", samples, action="move_downlink", **flags)
    assert reply.result.code == "invalid_argument" and "move_downlink" in reply.result.message
    assert down.moved_to is None and "error" in down.types()
    refused, _ = send(manager, "t", start=True, action="move_downlink")
    wait_for(refused.closed.is_set, "the refusal of a START that asks to move")
    assert refused.events[0].fields["code"] == "invalid_argument"


def test_move_of_a_closed_or_unknown_session_fails(stages):
    manager = SessionManager(ManagerConfig(), stages)
    _, reply = send(manager, "ghost", action="move_downlink")
    assert reply.result.code == "session_not_found"
    down, _ = send(manager, "s", start=True)
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "downlink FINAL")
    late, reply = send(manager, "s", action="move_downlink")
    assert reply.result.code == "session_not_found" and late.events == []
