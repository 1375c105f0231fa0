"""Code2Wav engine: window validation, per-request state, batching
(docs/model_facts.md#code2wav-windows; docs/architecture.md edge cases 4, 6).

Strategy: feed windows cut by the real `CodecWindowBridge` into the engine over the tiny random
vocoder. Audio is compared with a stand-alone `Token2Wav` stream decoding the same windows, so
"batched" and "keyed by request" are checked against an independent run; validation errors
are exact codes, and a rejected window must leave the request able to continue.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.contracts.messages import ACTION_STOP, Code2WavRequest
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.stages.code2wav_engine import ERROR_INTERNAL, Code2WavEngine, Code2WavResult, request_from_window
from backends.stages.window_checks import (
    ERROR_AFTER_LAST,
    ERROR_BELOW_LOOKAHEAD,
    ERROR_CHUNK_SEQ,
    ERROR_CODE_RANGE,
    ERROR_EMPTY_CHUNK,
    ERROR_LEFT_CONTEXT,
    ERROR_STALE_EPOCH,
)

# Rows of one batch take other kernel paths than a lone row: float32 summation order only,
# ~5e-7 on the mel, amplified by the random HiFT to at most ~1e-4 on the audio (measured).
# Sharing state between requests would differ at the signal level (~1e-2).
BATCH_ATOL = 5e-4


@pytest.fixture(scope="module")
def token2wav() -> Token2Wav:
    return random_token2wav(Token2WavConfig.tiny(), seed=0)


@pytest.fixture(scope="module")
def voice(token2wav: Token2Wav) -> Voice:
    """A random 2 s voice prompt (50 codes, 100 mel frames), prepared once."""
    return token2wav.prepare_voice(random_voice_prompt(0))


def _windows(seed: int, num_frames: int, unit_end: int | None = None) -> list[CodecWindow]:
    codes = np.random.default_rng(seed).integers(0, 6561, num_frames).tolist()
    bridge = CodecWindowBridge()
    split = num_frames if unit_end is None else unit_end
    windows = bridge.push(codes[:split]) + (bridge.end_unit() if unit_end is not None else [])
    return windows + bridge.push(codes[split:]) + bridge.end_turn()


def _alone(model: Token2Wav, voice: Voice, windows: list[CodecWindow]) -> np.ndarray:
    stream = model.new_stream(voice)
    return np.concatenate([
        model.decode([StreamWindow(stream, np.array(w.codes, np.int32), w.last_chunk)])[0]
        for w in windows
    ])


def _request(chunk_seq: int, codes: list[int] | None = None, epoch: int = 0, last: bool = False,
             request_id: str = "r") -> Code2WavRequest:
    codes = list(range(28)) if codes is None else codes
    return Code2WavRequest(request_id, epoch, chunk_seq, np.array(codes, np.int32), 3, last)


def _drain(engine: Code2WavEngine) -> list[list[Code2WavResult]]:
    steps = []
    while engine.num_pending():
        steps.append(engine.step())
    return steps


def test_eight_requests_in_one_step_equal_separate_runs(token2wav: Token2Wav, voice: Voice) -> None:
    plans = {f"s{i}": _windows(i, 30 + 11 * i, unit_end=9 + i) for i in range(8)}
    engine = Code2WavEngine(token2wav, voice)
    for request_id, windows in plans.items():
        for window in windows:
            engine.submit(request_from_window(request_id, window))
    steps = _drain(engine)
    assert len(steps[0]) == 8  # every request's first window shares the first forward
    assert all(len({r.request_id for r in step}) == len(step) for step in steps)
    audio: dict[str, list[np.ndarray]] = {}
    for result in (r for step in steps for r in step):
        assert result.error is None
        audio.setdefault(result.request_id, []).append(result.audio)
    for request_id, windows in plans.items():
        np.testing.assert_allclose(np.concatenate(audio[request_id]), _alone(token2wav, voice, windows),
                                   atol=BATCH_ATOL, rtol=0)
    assert engine.num_states() == 0  # every last_chunk dropped its state


def test_a_request_appears_once_per_forward(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(_request(0))
    engine.submit(_request(1))
    assert [r.chunk_seq for r in engine.step()] == [0]
    assert [r.chunk_seq for r in engine.step()] == [1]
    assert engine.step() == []


@pytest.mark.parametrize(
    ("requests", "code"),
    [
        ([_request(1)], ERROR_CHUNK_SEQ),  # an epoch must start at 0
        ([_request(0), _request(2)], ERROR_CHUNK_SEQ),  # gap
        ([_request(0), _request(0)], ERROR_CHUNK_SEQ),  # replay
        ([_request(0, epoch=2), _request(0, epoch=1)], ERROR_STALE_EPOCH),
        ([_request(0, last=True), _request(1)], ERROR_AFTER_LAST),
        ([_request(0, [])], ERROR_EMPTY_CHUNK),
        ([_request(0, [1, 2, 3])], ERROR_BELOW_LOOKAHEAD),
        ([_request(0, [5] * 27 + [6561])], ERROR_CODE_RANGE),  # the Talker EOS leaked
        ([Code2WavRequest("r", 0, 0, np.arange(28, dtype=np.int32), 0)], ERROR_LEFT_CONTEXT),
    ],
)
def test_validation_errors(token2wav: Token2Wav, voice: Voice, requests: list[Code2WavRequest], code: str) -> None:
    engine = Code2WavEngine(token2wav, voice)
    for request in requests:
        engine.submit(request)
    results = [r for step in _drain(engine) for r in step] + engine.step()
    errors = [r for r in results if r.error is not None]
    assert len(errors) == 1 and errors[0].error.startswith(code + ":"), results
    assert errors[0].audio.size == 0


def test_a_rejected_window_does_not_advance_the_sequence(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(_request(0))
    engine.submit(_request(2))
    engine.submit(_request(1))
    results = [r for step in _drain(engine) for r in step]
    assert [(r.chunk_seq, r.error is None) for r in results] == [(2, False), (0, True), (1, True)]


def test_placeholder_is_ignored(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(_request(-1, []))
    assert engine.step() == [] and engine.num_states() == 0 and engine.num_pending() == 0


def test_higher_epoch_restarts_from_fresh_state(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(_request(0))
    engine.submit(_request(1))
    engine.submit(_request(0, epoch=1))
    results = [r for step in _drain(engine) for r in step]
    first, restarted = results[0].audio, results[2].audio
    assert len(restarted) == 20160  # a first window again: the old held tail is gone
    np.testing.assert_array_equal(restarted, first)
    assert engine.num_states() == 1


def test_duplicate_terminal_flush_replays_nothing(token2wav: Token2Wav, voice: Voice) -> None:
    """Edge case 4: the bridge sends no second terminal window, and a stray one is refused."""
    bridge, engine = CodecWindowBridge(), Code2WavEngine(token2wav, voice)
    windows = bridge.push(list(range(30))) + bridge.end_turn() + bridge.end_turn()
    assert [w.last_chunk for w in windows] == [False, True]
    for window in windows + windows[-1:]:
        engine.submit(request_from_window("r", window))
    results = [r for step in _drain(engine) for r in step] + engine.step()
    assert [r.error is None for r in results] == [False, True, True]
    assert results[0].error.startswith(ERROR_AFTER_LAST)


def test_overlapping_request_ids_never_share_state(token2wav: Token2Wav, voice: Voice) -> None:
    """Edge case 6: an old and a new request of one session interleave; releasing the old one
    leaves the new one's stream intact."""
    old, new = _windows(1, 60), _windows(2, 60)
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(request_from_window("sess.e0", old[0]))
    engine.submit(request_from_window("sess.e1", new[0]))
    engine.step()
    engine.release("sess.e0")
    engine.release("sess.e0")  # idempotent
    for window in new[1:]:
        engine.submit(request_from_window("sess.e1", window))
    got = [r.audio for step in _drain(engine) for r in step]
    expected = _alone(token2wav, voice, new)[20160:]  # all but the first window, decoded earlier
    np.testing.assert_allclose(np.concatenate(got), expected, atol=BATCH_ATOL, rtol=0)


def test_stop_action_releases(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    engine.submit(_request(0))
    engine.step()
    engine.submit(_request(1))
    engine.submit(Code2WavRequest("r", 0, 0, np.zeros(0, np.int32), action=ACTION_STOP))
    assert engine.num_states() == 0 and engine.num_pending() == 0 and engine.step() == []
    engine.submit(_request(0))  # a stopped id may start again at 0
    assert engine.step()[0].error is None


def test_stream_total_through_bridge_and_engine(token2wav: Token2Wav, voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, voice)
    for window in _windows(5, 77, unit_end=31):
        engine.submit(request_from_window("r", window))
    results = [r for step in _drain(engine) for r in step]
    assert results[-1].last_chunk and engine.num_states() == 0
    assert sum(r.audio.size for r in results) == 960 * (77 + 3)


def test_a_failed_forward_answers_and_releases_every_window(token2wav: Token2Wav, voice: Voice) -> None:
    class Broken(Token2Wav):
        def decode(self, windows: list[StreamWindow]) -> list[np.ndarray]:
            raise RuntimeError("device lost")

    broken = Broken(token2wav.config)
    engine = Code2WavEngine(broken, voice)
    engine.submit(_request(0, request_id="a"))
    engine.submit(_request(0, request_id="b"))
    results = engine.step()
    assert [r.error.split(":")[0] for r in results] == [ERROR_INTERNAL, ERROR_INTERNAL]
    assert engine.num_states() == 0 and engine.num_pending() == 0


def test_max_batch_caps_a_forward_and_serves_requests_round_robin(token2wav: Token2Wav, voice: Voice) -> None:
    """Memory of a forward grows with its windows: at most `max_batch` per step, and a request
    with more windows (audio already sent) waits behind first windows instead of starving them;
    a due first window goes alone rather than with a window whose client has audio queued (the
    clock stands still: a's second of audio keeps it from being due)."""
    engine = Code2WavEngine(token2wav, voice, max_batch=2, clock=lambda: 100.0)
    for chunk_seq in range(3):
        engine.submit(_request(chunk_seq, request_id="a", last=chunk_seq == 2))
    engine.submit(_request(0, request_id="b", last=True))
    engine.submit(_request(0, request_id="c", last=True))
    steps = [[(r.request_id, r.chunk_seq) for r in step] for step in _drain(engine)]
    assert steps == [[("a", 0), ("b", 0)], [("c", 0)], [("a", 1)], [("a", 2)]]
    assert engine.num_states() == 0


def test_session_voices_off_speaks_the_default_voice(token2wav: Token2Wav, voice: Voice) -> None:
    reference = np.random.default_rng(3).uniform(-0.5, 0.5, 16000).astype(np.float32)
    windows = _windows(5, 40)
    audio = {}
    for name, ref in (("default", np.zeros(0, np.float32)), ("ref", reference)):
        engine = Code2WavEngine(token2wav, voice, session_voices=False)
        for i, window in enumerate(windows):
            request = request_from_window(name, window)
            if i == 0:
                request = dataclasses.replace(request, ref_audio=ref)
            engine.submit(request)
        audio[name] = np.concatenate([r.audio for step in _drain(engine) for r in step])
        assert engine.resource_counts()["voice_cache"] == 0  # nothing prepared
    np.testing.assert_array_equal(audio["ref"], audio["default"])


def test_a_first_window_overtakes_a_stream_with_audio_queued(token2wav: Token2Wav, voice: Voice) -> None:
    """Least playback slack first (backends/stages/window_schedule.py), on a fake clock: a
    stream whose client still has seconds of audio waits while a new reply's first window
    (nothing to play yet) is decoded, and a stream whose client ran dry goes first of all."""
    now = [100.0]
    engine = Code2WavEngine(token2wav, voice, max_batch=1, clock=lambda: now[0])
    engine.submit(_request(0, codes=list(range(3 + 100)), request_id="long"))
    (first,) = engine.step()
    assert first.request_id == "long" and first.audio.size / token2wav.sample_rate > 3.0
    engine.submit(_request(1, request_id="long"))
    now[0] += 0.1
    engine.submit(_request(0, request_id="new"))
    assert [r.request_id for r in engine.step()] == ["new"]  # long has > 3 s queued
    engine.submit(_request(1, request_id="new"))  # new's first second runs dry at ~101.1
    now[0] = 102.0
    engine.submit(_request(0, request_id="later"))
    order = [r.request_id for _ in range(3) for r in engine.step()]
    assert order == ["new", "later", "long"]


def test_each_window_reports_how_long_it_queued(token2wav: Token2Wav, voice: Voice) -> None:
    """`on_window_wait`, on a fake clock: (kind, seconds from arrival to its forward's start),
    kind "first" for a reply's first window (chunk_seq 0), "later" for the others."""
    now = [50.0]
    waits: list[tuple[str, float]] = []
    engine = Code2WavEngine(token2wav, voice, max_batch=1, clock=lambda: now[0])
    engine.on_window_wait = lambda kind, seconds: waits.append((kind, round(seconds, 9)))
    engine.submit(_request(0, request_id="a"))
    now[0] += 0.25
    engine.submit(_request(0, request_id="b"))
    engine.submit(_request(1, request_id="a"))
    order = []
    for _ in range(3):  # least slack first: a's first window (oldest), b's, then a's second
        order += [r.request_id for r in engine.step()]
        now[0] += 0.1
    assert order == ["a", "b", "a"]
    assert waits == [("first", 0.25), ("first", 0.1), ("later", 0.2)]


def _long_stream_with_a_window_pending(engine: Code2WavEngine) -> None:
    """"long": 4 s of audio sent (its client has them queued), its next window pending."""
    engine.submit(_request(0, codes=list(range(3 + 100)), request_id="long"))
    assert [r.request_id for r in engine.step()] == ["long"]
    engine.submit(_request(1, request_id="long"))


def test_an_announced_first_window_holds_the_windows_that_can_wait(token2wav: Token2Wav, voice: Voice) -> None:
    """`expect_window` (the orchestrator, as a reply's Talker starts): until that reply's first
    window arrives, a window whose client still has audio queued waits, so the first window
    finds the engine free; it goes alone, then the held one."""
    now = [100.0]
    engine = Code2WavEngine(token2wav, voice, max_batch=8, clock=lambda: now[0])
    _long_stream_with_a_window_pending(engine)
    engine.expect_window("new")
    now[0] += 0.01
    assert engine.step() == [] and engine.num_pending() == 1
    assert engine.holding_s() == pytest.approx(engine.first_window_hold_s - 0.01)
    engine.submit(_request(0, request_id="new"))
    assert engine.holding_s() == 0.0
    assert [r.request_id for r in engine.step()] == ["new"]
    assert [r.request_id for r in engine.step()] == ["long"]


def test_a_hold_ends_when_its_time_is_up_or_its_request_stops(token2wav: Token2Wav, voice: Voice) -> None:
    now = [100.0]
    engine = Code2WavEngine(token2wav, voice, max_batch=8, clock=lambda: now[0])
    _long_stream_with_a_window_pending(engine)
    engine.expect_window("never")  # its Talker ended without a window
    assert engine.step() == []
    now[0] += engine.first_window_hold_s
    assert engine.holding_s() == 0.0
    assert [r.request_id for r in engine.step()] == ["long"]
    engine.submit(_request(2, request_id="long"))
    engine.expect_window("stopped")
    assert engine.holding_s() > 0.0
    engine.submit(Code2WavRequest("stopped", 0, 0, np.zeros(0, np.int32), action=ACTION_STOP))
    assert engine.holding_s() == 0.0
    assert [r.request_id for r in engine.step()] == ["long"]


def test_a_due_window_is_never_held(token2wav: Token2Wav, voice: Voice) -> None:
    """A client about to run dry gets its window whatever is announced; so does every window
    when holds are off (first_window_hold_s = 0)."""
    now = [100.0]
    engine = Code2WavEngine(token2wav, voice, max_batch=8, clock=lambda: now[0])
    _long_stream_with_a_window_pending(engine)
    now[0] += 4.0  # long's 4 s are nearly played out
    engine.expect_window("new")
    assert engine.holding_s() == 0.0
    assert [r.request_id for r in engine.step()] == ["long"]
    off = Code2WavEngine(token2wav, voice, max_batch=8, clock=lambda: now[0], first_window_hold_s=0.0)
    _long_stream_with_a_window_pending(off)
    off.expect_window("new")
    assert off.holding_s() == 0.0
    assert [r.request_id for r in off.step()] == ["long"]
