"""The uplink bound on a session: a flood past it is refused request by request (error reply
plus an `error` event), the session goes on, what it holds stays under the bound, and a
close frees all of it.

Strategy: the scripted Thinker is held (its gate closed), so nothing queued is taken and
only the bound decides; the session's held audio is read from `SessionManager.stats()`.
"""
from __future__ import annotations

from scripted_stages import ScriptedStages, send, wait_for

from backends.duplex.session_manager import ManagerConfig, SessionManager

UNIT = 16000


def _flood(manager: SessionManager, sid: str, appends: int, samples: int = UNIT) -> list:
    return [send(manager, sid, samples)[1].result for _ in range(appends)]


def test_a_flood_is_refused_past_the_bound_and_the_session_goes_on():
    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    results = _flood(manager, "s", 20)
    refused = [r for r in results if r != "ok"]
    assert results.count("ok") <= 5 and len(refused) >= 15  # 5 s ahead, plus what the clock drained
    assert all(r.code == "resource_exhausted" and "'s'" in r.message for r in refused)
    errors = [e for e in down.events if e.type == "error"]
    assert len(errors) == len(refused) and errors[0].fields["code"] == "resource_exhausted"
    assert manager.stats()["uplink_audio_ms"] <= 5000
    stages.gate.set()
    wait_for(lambda: sum(stages.units_seen.values()) == results.count("ok"), "the accepted units decided")
    wait_for(lambda: manager.stats()["uplink_audio_ms"] == 0, "the queue drained")
    _, reply = send(manager, "s", UNIT)  # the model took it all: the session may send again
    assert reply.result == "ok" and not down.closed.is_set()
    manager.shutdown()


def test_closing_a_flooded_session_frees_what_it_queued():
    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()  # the Thinker never takes a unit before the close
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    _flood(manager, "s", 10, samples=UNIT * 3 // 4)  # whole units queued and a partial one
    assert manager.stats()["uplink_audio_ms"] == 5000 - 5000 % 750
    down.cancelled.set()  # the client goes away
    wait_for(lambda: manager.stats()["uplink_audio_ms"] == 0, "freed at close, the Thinker call still held")
    stages.gate.set()
    wait_for(lambda: manager.num_sessions == 0, "the session finished")
    manager.shutdown()


def test_an_end_past_the_bound_still_ends_the_session():
    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    _flood(manager, "s", 5)
    _, reply = send(manager, "s", UNIT, end=True)
    assert reply.result.code == "resource_exhausted"
    stages.gate.set()
    wait_for(down.closed.is_set, "the session closed")
    assert down.events[-1].fields["reason"] == "client" and sum(stages.units_seen.values()) == 5
    manager.shutdown()


def test_start_audio_past_the_bound_is_refused_but_the_session_is_created():
    manager = SessionManager(ManagerConfig(), ScriptedStages())
    down, _ = send(manager, "s", UNIT * 6, start=True)
    assert down.types() == ["session.created", "error"]
    assert down.events[1].fields["code"] == "invalid_argument" and not down.closed.is_set()
    manager.shutdown()
