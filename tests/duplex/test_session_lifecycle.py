"""Session lifecycle with scripted stages: the races a barge-in or a close can lose, client-gone
and idle reaping, shutdown, and the orchestrator's own resource counts.

Strategy: `ScriptedStages.open` mirrors the engines' request tables (a first request opens its
id when it *reaches* the stage, a stop closes it), and gates hold a call in flight so that a
stop can overtake it. After every session the test asserts nothing is left open: that is the
leak a lost race produces in the real engines (KV blocks, codec state).
"""
from __future__ import annotations

import threading
import time

import numpy as np
from scripted_stages import (
    ManualClock, ReaperSweeps, RecordingDownlink, RecordingReply, ScriptedStages, send, wait_finished, wait_for,
)

from backends.duplex.session_manager import CLOSING_GRACE, ManagerConfig, SessionManager
from backends.duplex.uplink import RawUplink


def _closed_reason(down: RecordingDownlink) -> str:
    return down.events[-1].fields["reason"]


def test_stop_overtaking_the_first_append_leaves_no_thinker_request():
    """Edge case 1: a barge-in while the epoch's first append is still on its way. The stop
    reaches the Thinker first; the append then opens the old request. The Thinker loop must
    stop it again once its call returns, or the old request holds its KV for good."""
    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_for(lambda: stages.calls["thinker"] == 1, "the first append in flight")
    send(manager, "s", action="cancel")
    assert ("thinker", "s.e0") in stages.stops  # the early stop, before the append arrived
    stages.gate.set()
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "session closed")
    assert stages.open == set(), stages.open
    assert "response.audio.delta" not in down.types()


def test_stop_overtaking_a_talker_condition_leaves_no_talker_or_codec_state():
    """Edge cases 1 and 7 on the audio tail: the first condition of a turn is held while the
    client barges in. The old Talker request and its Code2Wav stream must end up stopped, and
    no audio of the cancelled response may reach the client."""
    stages = ScriptedStages(speak_from=0, reply_units=3)
    stages.talker_gate.clear()
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_for(lambda: stages.calls["talker"] == 1, "the first condition in flight")
    send(manager, "s", action="cancel")
    stages.talker_gate.set()
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "session closed")
    assert stages.open == set(), stages.open
    assert "response.audio.delta" not in down.types()
    done = [e for e in down.events if e.type == "response.done"]
    assert [e.fields["status"] for e in done] == ["cancelled"]


def _one_reply(stages: ScriptedStages) -> SessionManager:
    """A session that gets three units of audio, waits for its reply's end and ends."""
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    for _ in range(3):
        send(manager, "s", 16000)
    wait_for(lambda: "response.done" in down.types(), "reply done")
    send(manager, "s", end=True)
    wait_finished(manager, down, "session closed")
    return manager


def test_a_finished_session_leaves_no_stage_request_open():
    stages = ScriptedStages(speak_from=0, reply_units=2)
    manager = _one_reply(stages)
    assert stages.open == set() and manager.num_sessions == 0


def test_client_gone_closes_the_session_and_frees_its_transport():
    stages = ScriptedStages(speak_from=0, reply_units=3)
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000 * 2)
    wait_for(lambda: "response.audio.delta" in down.types(), "audio")
    down.cancelled.set()  # the client stopped its stream: no END will come
    wait_finished(manager, down, "client-gone close")
    assert _closed_reason(down) == "client_gone" and down.abandoned
    assert stages.open == set() and manager.num_sessions == 0


def test_an_error_close_frees_the_transport():
    """A session closed by a stage error may never hear the client's END again."""
    stages = ScriptedStages()
    stages.fail_on["thinker"] = 1
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_finished(manager, down, "error close")
    assert _closed_reason(down) == "error" and down.abandoned


def test_a_talker_stream_that_ends_before_its_last_frames_fails_the_session():
    """A stage that fails after its first results ends its stream with a plain FINAL (the
    stages' contract: backends/serving/triton_responses.py): the session must report it, not
    wait or go on silently."""
    stages = ScriptedStages(speak_from=0, reply_units=2)
    stages.talker_unfinished = True
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_finished(manager, down, "error close")
    error = next(e for e in down.events if e.type == "error")
    assert error.fields["code"] == "stage_failed" and "ended before its last frames" in error.fields["message"]
    assert _closed_reason(down) == "error" and stages.open == set() and manager.num_sessions == 0
    done = [e.fields["status"] for e in down.events if e.type == "response.done"]
    assert done == ["failed"], down.types()


def test_client_end_keeps_the_transport():
    """An END releases the transport itself (Triton's sequence slot): no abandon."""
    manager = SessionManager(ManagerConfig(), ScriptedStages())
    down, _ = send(manager, "s", start=True)
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "closed")
    assert _closed_reason(down) == "client" and not down.abandoned


def test_idle_reap_abandons_but_a_flushing_session_gets_a_grace():
    """A session that sent END is finishing its audio: a short idle timeout must not cut it
    (it would drop the tail of the reply), while a silent open session is reaped. The clock
    moves by hand, so the reaper sees exactly "past the idle timeout, within the grace"."""
    idle_s, clock, sweeps = 0.4, ManualClock(), ReaperSweeps()
    assert CLOSING_GRACE > 1.5, "the step below must land within the grace"
    stages = ScriptedStages(speak_from=0, reply_units=1)
    manager = SessionManager(ManagerConfig(idle_timeout_s=idle_s), stages, clock=clock, observer=sweeps)
    silent, _ = send(manager, "quiet", start=True)
    flushing, _ = send(manager, "busy", start=True)
    stages.gate.clear()
    send(manager, "busy", 16000, end=True)
    clock.advance(1.5 * idle_s)  # past the idle timeout, within the grace
    wait_for(silent.closed.is_set, "the idle close")
    sweeps.wait_more(2)  # sweeps that saw the flushing session at the same idle time
    assert not [stop for stop in stages.stops if stop[1].startswith("busy.")], "the flushing session was reaped"
    stages.gate.set()
    wait_finished(manager, flushing, "the flushed close")
    assert _closed_reason(silent) == "idle" and silent.abandoned
    assert _closed_reason(flushing) == "client" and "response.audio.delta" in flushing.types()


def test_shutdown_closes_sessions_without_calling_the_stages():
    """At server shutdown the stage models finalize too: a stop then may wait out the stage
    timeout."""
    stages = ScriptedStages(speak_from=99)
    manager = SessionManager(ManagerConfig(), stages)
    downs = [send(manager, sid, start=True)[0] for sid in ("a", "b")]
    manager.shutdown()
    for down in downs:
        wait_for(down.closed.is_set, "closed at shutdown")
        assert _closed_reason(down) == "server_shutdown" and not down.abandoned
    assert stages.stops == []


def _session_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("thinker-", "audio-"))]


def test_stats_and_observer_follow_the_sessions():
    seen: list[dict[str, int]] = []
    manager = SessionManager(ManagerConfig(), ScriptedStages(), observer=seen.append)
    # Sessions of earlier tests may still be ending their threads (a close is announced before
    # its loops return): the process's count is only steady once they are gone.
    wait_for(lambda: not _session_threads(), "the threads of earlier sessions ended")
    threads_before = threading.active_count()
    down, _ = send(manager, "s", start=True)
    assert manager.stats() == {"sessions": 1, "session_threads": 2, "stranded_threads": 0,
                               "threads": threads_before + 2, "uplink_audio_ms": 0}
    wait_for(lambda: seen and seen[-1]["sessions"] == 1, "observer saw the session")
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "closed")
    wait_for(lambda: manager.stats() == {"sessions": 0, "session_threads": 0, "stranded_threads": 0,
                                      "threads": threads_before, "uplink_audio_ms": 0}, "threads gone")
    wait_for(lambda: seen[-1]["sessions"] == 0 and seen[-1]["threads"] == threads_before, "observer saw the close")


def test_a_session_stuck_in_a_stage_call_is_finished_by_the_reaper(monkeypatch):
    """A stage call that never delivers its FINAL must not keep the session, its admission slot
    or its client waiting: the reaper finishes it; the stuck thread is counted until it
    returns, and its return changes nothing."""
    import backends.duplex.session_manager as session_manager

    monkeypatch.setattr(session_manager, "STUCK_CLOSE_S", 0.3)
    sweeps = ReaperSweeps()
    stages = ScriptedStages(speak_from=99)
    stages.gate.clear()  # the Thinker call never answers
    manager = SessionManager(ManagerConfig(), stages, observer=sweeps)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_for(lambda: stages.calls["thinker"] == 1, "the call in flight")
    down.cancelled.set()
    wait_finished(manager, down, "forced finish")
    assert _closed_reason(down) == "client_gone" and manager.num_sessions == 0
    wait_for(lambda: manager.stats()["stranded_threads"] >= 1, "stranded thread counted")
    stops_before = len(stages.stops)
    sweeps.wait_more(2)  # more reaper sweeps: the closed session is neither closed again nor re-stopped
    assert len(stages.stops) == stops_before
    stages.gate.set()
    wait_for(lambda: manager.stats()["stranded_threads"] == 0, "stranded thread returned")
    assert down.types().count("session.closed") == 1


def test_a_stage_that_never_answers_fails_the_session_with_stage_timeout(monkeypatch):
    import backends.duplex.session_manager as session_manager

    monkeypatch.setattr(session_manager, "STUCK_CLOSE_S", 0.2)
    stages = ScriptedStages(speak_from=0, reply_units=2)
    stages.talker_gate.clear()  # the Talker never answers: the client keeps streaming
    manager = SessionManager(ManagerConfig(stage_timeout_s=0.5), stages)
    down, _ = send(manager, "s", start=True)
    send(manager, "s", 16000)
    wait_for(lambda: stages.calls["talker"] == 1, "the call in flight")
    for _ in range(10):  # an active client: the idle reaper never fires
        send(manager, "s", 1600)
        time.sleep(0.1)
    wait_finished(manager, down, "stage timeout close")
    error = next(e for e in down.events if e.type == "error")
    assert error.fields["code"] == "stage_timeout" and _closed_reason(down) == "error"
    assert manager.num_sessions == 0
    stages.talker_gate.set()


def test_the_start_reference_voice_reaches_code2wav_on_each_streams_first_window():
    stages = ScriptedStages(speak_from=0, reply_units=2)
    manager = SessionManager(ManagerConfig(), stages)
    ref = np.arange(3200, dtype=np.int16)
    down, reply = RecordingDownlink(), RecordingReply()
    manager.handle(RawUplink("s", True, False, np.zeros(0, np.int16), ref, "{}"), reply, lambda: down)
    for _ in range(3):
        send(manager, "s", 16000)
    wait_for(lambda: "response.done" in down.types(), "reply done")
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "session closed")
    windows = [r for r in stages.requests if hasattr(r, "chunk_seq") and hasattr(r, "ref_audio")]
    assert len(windows) > 1 and windows[0].chunk_seq == 0
    np.testing.assert_array_equal(windows[0].ref_audio, ref.astype(np.float32) / 32768.0)
    assert all(w.ref_audio.size == 0 for w in windows if w.chunk_seq > 0)


def test_each_reply_announces_its_first_window_to_code2wav_before_its_talker_call():
    """The reply's first window comes out of its first Talker call: Code2Wav hears of it first
    (`expect_window`), once per reply, under the Code2Wav request id of that reply's windows."""
    stages = ScriptedStages(speak_from=0, reply_units=2)
    _one_reply(stages)
    talker_starts = [i for i, r in enumerate(r for r in stages.requests if hasattr(r, "turn_start"))
                     if r.turn_start]
    first_windows = [r.request_id for r in stages.requests if hasattr(r, "chunk_seq") and r.chunk_seq == 0]
    assert stages.expected == [(request_id, calls) for request_id, calls in zip(first_windows, talker_starts)]
    assert stages.expected and stages.expected[0] == ("s.e0", 0)


def test_a_text_only_session_replies_in_text_without_the_speech_stages():
    """START tts_enabled=false: the reply's text and its response.done, no Talker request, no
    Code2Wav window, no audio."""
    stages = ScriptedStages(speak_from=0, reply_units=2)
    manager = SessionManager(ManagerConfig(), stages)
    down, _ = send(manager, "s", start=True, tts_enabled=False)
    for _ in range(3):
        send(manager, "s", 16000)
    wait_for(lambda: "response.done" in down.types(), "reply done")
    send(manager, "s", end=True)
    wait_for(down.closed.is_set, "session closed")
    done = next(e for e in down.events if e.type == "response.done")
    assert done.fields["status"] == "completed"
    assert "response.text.delta" in down.types() and "response.audio.delta" not in down.types()
    assert stages.calls["talker"] == 0 and not [r for r in stages.requests if hasattr(r, "chunk_seq")]
    assert stages.open == set() and manager.num_sessions == 0
