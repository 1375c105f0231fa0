"""The `duplex` model on a real tritonserver (cpu profile, tiny model): whole sessions through the
client library, concurrency and seeded reproducibility, and every bad input of
docs/duplex_contract.md (#uplink-every-request, #errors) followed by a valid session on the same
server.

Sessions stream faster than real time (SPEED) to keep CI short; the server cuts the same
1-second units either way, and `max_units_per_append` = 1 keeps one decision per unit.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from client.events import AudioDelta, ResponseDone, SessionClosed, SessionCreated
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance
from client.wav import read_wav

SPEED = 4.0
DEMO_WAV = Path(__file__).resolve().parents[2] / "client" / "data" / "hello_16k.wav"
FIRST_CHUNK = 20160  # 25 frames - the cross-fade hold (docs/model_facts.md#code2wav-windows)
STEADY_CHUNK = 24000  # 25 frames x 960 samples
SAMPLES_PER_FRAME = 960
# Batched and solo forwards differ in float rounding only: the Talker's codes are the same
# (the texts and chunk sizes are compared exactly) and Code2Wav's batched windows match solo
# ones to 5e-4 (BATCH_ATOL in tests/stages/test_code2wav_engine.py: the 10 Euler steps carry
# the summation-order difference into the audio); as int16 that is 5e-4 * 32767 < 17 LSB
# (-66 dBFS). Measured on CPU: up to 10 LSB. Crossed state would differ by thousands.
AUDIO_LSB_TOLERANCE = 17


def _speech() -> np.ndarray:
    return read_wav(DEMO_WAV).samples[:, 0]


def _session(url: str, session_id: str, seed: int = 7, reply_units: int = 3, ref_audio: np.ndarray | None = None,
             downlink_move_s: float | None = None, moves: list[int] | None = None):
    events: list = []
    params = SessionParams(initial_user_text="Tell me about the sea.", seed=seed,
                           reply_units=reply_units, reply_tokens_per_unit=4)
    with DuplexSession.connect(url, session_id=session_id, downlink_move_s=downlink_move_s) as session:
        report = stream_utterance(session, _speech(), params, StreamConfig(speed=SPEED, max_seconds=20),
                                  ref_audio=ref_audio, on_event=events.append)
        (moves if moves is not None else []).append(session.num_downlink_moves)
    return report, events


def test_session_start_to_end_streams_a_reply(server):
    report, events = _session(server.grpc_url, "srv-basic")
    assert report.ok and report.closed_cleanly, report.errors
    types = [e.type for e in events]
    assert types[0] == "session.created" and types[-1] == "session.closed"
    assert types.count("session.closed") == 1
    created = [i for i, t in enumerate(types) if t == "response.created"]
    done = [i for i, t in enumerate(types) if t == "response.done"]
    assert len(created) == len(done) >= 1, "exactly one response.done per turn"
    first = created[0]
    assert types[first + 1] == "response.speak"
    audio = [e for e in events if isinstance(e, AudioDelta)]
    assert audio and all(first < events.index(e) < done[0] for e in audio if e.response_id == audio[0].response_id)
    assert isinstance(events[done[0]], ResponseDone) and events[done[0]].status == "completed"
    sizes = [e.audio.size for e in audio]
    assert all(e.audio.dtype == np.int16 for e in audio)
    assert sizes[0] == FIRST_CHUNK and all(s % SAMPLES_PER_FRAME == 0 for s in sizes)
    assert all(s <= STEADY_CHUNK for s in sizes[:-1]) and STEADY_CHUNK in sizes
    assert audio[0].ttfp_ms is not None and audio[0].ttfp_ms > 0
    assert audio[-1].audio_ms == pytest.approx(1000.0 * sum(sizes) / 24000, abs=0.1)
    assert np.abs(np.concatenate([e.audio for e in audio])).max() > 100, "reply audio is silent"
    closed = events[-1]
    assert isinstance(closed, SessionClosed) and closed.reason == "client"


def test_a_refused_start_through_the_client_sends_no_end(server):
    """The server ends a refused START's sequence itself: the client sends no END (Triton would
    refuse one with "must specify the START flag"), and the same id then opens a session."""
    refused = SessionParams(reply_units=3)  # without reply_tokens_per_unit: invalid_argument
    with DuplexSession.connect(server.grpc_url, session_id="srv-refused") as session:
        report = stream_utterance(session, _speech()[:16000], refused, StreamConfig(speed=SPEED, max_seconds=2))
    assert len(report.errors) == 1 and report.errors[0].startswith("error event invalid_argument"), report.errors
    assert report.turns == () and not report.closed_cleanly
    with DuplexSession.connect(server.grpc_url, session_id="srv-refused") as session:
        session.start(SessionParams(seed=1))
        assert isinstance(session.next_event(60.0), SessionCreated)
        session.end()
        assert isinstance(list(session.drain(60.0))[-1], SessionClosed)


def test_concurrent_sessions_are_isolated_and_reproducible(server):
    alone_report, alone = _session(server.grpc_url, "srv-alone", seed=11)
    results: dict[str, tuple] = {}

    def run(sid: str, seed: int) -> None:
        results[sid] = _session(server.grpc_url, sid, seed=seed)

    threads = [threading.Thread(target=run, args=(sid, seed)) for sid, seed in (("srv-a", 11), ("srv-b", 12))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for sid, (report, events) in results.items():
        assert report.ok, (sid, report.errors)
        assert {e.session_id for e in events} == {sid}, "events crossed sessions"
        response_ids = {e.response_id for e in events if isinstance(e, AudioDelta)}
        assert all(rid.startswith(f"resp-{sid}-") for rid in response_ids)
    same_seed = results["srv-a"][1]
    texts = lambda evs: [e.text for e in evs if e.type == "response.text.delta"]  # noqa: E731
    assert texts(same_seed) == texts(alone)
    audio_a = np.concatenate([e.audio for e in same_seed if isinstance(e, AudioDelta)]).astype(np.int32)
    audio_alone = np.concatenate([e.audio for e in alone if isinstance(e, AudioDelta)]).astype(np.int32)
    assert audio_a.shape == audio_alone.shape
    assert np.abs(audio_a - audio_alone).max() <= AUDIO_LSB_TOLERANCE
    assert texts(results["srv-b"][1]) != texts(alone), "a different seed should give a different reply"


def test_a_downlink_moved_again_and_again_loses_nothing(server):
    """A session that moves its downlink whenever 50 ms have passed (several moves) against the
    same session never moved: the same events in the same order, the same text and audio."""
    moves: list[int] = []
    still_report, still = _session(server.grpc_url, "srv-still", seed=13)
    moved_report, moved = _session(server.grpc_url, "srv-moved", seed=13, downlink_move_s=0.05, moves=moves)
    assert still_report.ok and moved_report.ok and moved_report.closed_cleanly, moved_report.errors
    assert moves[0] >= 5, moves
    assert [e.type for e in moved] == [e.type for e in still]
    texts = lambda evs: [e.text for e in evs if e.type == "response.text.delta"]  # noqa: E731
    assert texts(moved) == texts(still)
    audio = [np.concatenate([e.audio for e in evs if isinstance(e, AudioDelta)]).astype(np.int32)
             for evs in (moved, still)]
    assert audio[0].shape == audio[1].shape and np.abs(audio[0] - audio[1]).max() <= AUDIO_LSB_TOLERANCE


def test_concurrent_sessions_speak_in_their_own_reference_voices(server):
    """REF_AUDIO reaches Code2Wav: two sessions at once with different references get different
    reply audio, and the code2wav stage prepared (at least) their two voices, used by no stream
    once the sessions are over. The seeds are fresh voices: no other test sent them."""
    from server_resources import _gauges, wait_for_gauges

    from backends.stages.voice_cache import DEFAULT_CAPACITY
    from perf.voices import voice_pcm16

    before = _gauges(server).get(("voice_cache", "code2wav"), 0.0)
    results: dict[str, tuple] = {}

    def run(sid: str, voice_seed: int) -> None:
        results[sid] = _session(server.grpc_url, sid, seed=5, reply_units=2, ref_audio=voice_pcm16(voice_seed))

    threads = [threading.Thread(target=run, args=args) for args in (("srv-voice-a", 901), ("srv-voice-b", 902))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    audio = {}
    for sid, (report, events) in results.items():
        assert report.ok, (sid, report.errors)
        audio[sid] = np.concatenate([e.audio for e in events if isinstance(e, AudioDelta)]).astype(np.int32)
    a, b = audio["srv-voice-a"], audio["srv-voice-b"]
    n = min(a.size, b.size)
    assert n > 0 and np.abs(a[:n] - b[:n]).max() > 100, "different reference voices gave the same audio"
    assert wait_for_gauges(server, {("voice_users", "code2wav"): 0.0}) == {("voice_users", "code2wav"): 0.0}
    assert _gauges(server)[("voice_cache", "code2wav")] >= min(before + 2, DEFAULT_CAPACITY)
