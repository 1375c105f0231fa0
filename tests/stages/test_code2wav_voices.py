"""Code2Wav reference voices (REF_AUDIO on a cache epoch's first window): the stream speaks in
its reference voice, the voice cache shares and evicts prepared voices with explicit
lifetimes, and bad references are `invalid_ref_audio` errors of that request only.

Strategy: the engine over the tiny random vocoder, its default voice prepared from a synthetic
16 kHz clip. Audio of a referenced stream is compared with a stand-alone `Token2Wav` stream
started from `voice_from_audio(reference)`, the same preparation the default voice gets, so
"the stream uses its reference voice" and "batched rows with different voices stay
independent" are checked against an independent run; the default voice's own clip sent as a
reference must give bit-identical audio.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.contracts.messages import ACTION_STOP, Code2WavRequest
from backends.contracts.sink import ListSink
from backends.contracts.tensor_codec import ContractError, from_arrays, to_arrays
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav
from backends.stages.code2wav_engine import Code2WavEngine, request_from_window
from backends.stages.code2wav_service import Code2WavService
from backends.stages.voice_cache import ERROR_REF_AUDIO, VoiceCache, voice_key

BATCH_ATOL = 5e-4  # float32 summation order of batched rows (test_code2wav_engine.py)
REF_SECONDS = 2.0


def _clip(seed: int) -> np.ndarray:
    return synthesize_reference_voice(seed, 16000, REF_SECONDS).astype(np.float32)


@pytest.fixture(scope="module")
def token2wav() -> Token2Wav:
    return random_token2wav(Token2WavConfig.tiny(), seed=0)


@pytest.fixture(scope="module")
def default_voice(token2wav: Token2Wav) -> Voice:
    return token2wav.voice_from_audio(torch.from_numpy(_clip(0)), 16000)


def _windows(seed: int, num_frames: int = 60) -> list[CodecWindow]:
    codes = np.random.default_rng(seed).integers(0, 6561, num_frames).tolist()
    bridge = CodecWindowBridge()
    return bridge.push(codes) + bridge.end_turn()


def _submit(engine: Code2WavEngine, request_id: str, windows: list[CodecWindow],
            ref: np.ndarray | None = None) -> None:
    for window in windows:
        request = request_from_window(request_id, window)
        if ref is not None and window.chunk_seq == 0:
            request = _with_ref(request, ref)
        engine.submit(request)


def _with_ref(request: Code2WavRequest, ref: np.ndarray) -> Code2WavRequest:
    return Code2WavRequest(request.request_id, request.cache_epoch, request.chunk_seq, request.codes,
                           request.num_left_context, request.last_chunk, ref_audio=ref)


def _run(engine: Code2WavEngine) -> dict[str, np.ndarray]:
    audio: dict[str, list[np.ndarray]] = {}
    while engine.num_pending():
        for result in engine.step():
            assert result.error is None, result.error
            audio.setdefault(result.request_id, []).append(result.audio)
    return {rid: np.concatenate(chunks) for rid, chunks in audio.items()}


def _alone(model: Token2Wav, voice: Voice, windows: list[CodecWindow]) -> np.ndarray:
    stream = model.new_stream(voice)
    return np.concatenate([
        model.decode([StreamWindow(stream, np.array(w.codes, np.int32), w.last_chunk)])[0] for w in windows
    ])


def test_different_references_give_different_audio(token2wav: Token2Wav, default_voice: Voice) -> None:
    engine = Code2WavEngine(token2wav, default_voice)
    windows = _windows(1)
    _submit(engine, "a", windows, _clip(1))
    _submit(engine, "b", windows, _clip(2))
    _submit(engine, "plain", windows)
    audio = _run(engine)
    assert np.abs(audio["a"] - audio["b"]).max() > 1e-2
    assert np.abs(audio["a"] - audio["plain"]).max() > 1e-2
    voice_a = token2wav.voice_from_audio(torch.from_numpy(_clip(1)), 16000)
    np.testing.assert_allclose(audio["a"], _alone(token2wav, voice_a, windows), atol=BATCH_ATOL, rtol=0)


def test_the_default_clip_as_reference_gives_the_default_audio_exactly(token2wav, default_voice) -> None:
    windows = _windows(2)
    runs = {}
    for name, ref in (("default", None), ("referenced", _clip(0))):
        engine = Code2WavEngine(token2wav, default_voice)
        _submit(engine, "r", windows, ref)
        runs[name] = _run(engine)["r"]
    np.testing.assert_array_equal(runs["referenced"], runs["default"])


def test_streams_of_one_reference_share_one_prepared_voice(token2wav, default_voice) -> None:
    engine = Code2WavEngine(token2wav, default_voice)
    windows = _windows(3)
    for request_id in ("a", "b"):
        _submit(engine, request_id, windows, _clip(4))
    engine.step()
    counts = engine.resource_counts()
    assert counts["voice_cache"] == 1 and counts["voice_users"] == 2 and engine.voices.num_prepared == 1
    audio = _run(engine)
    np.testing.assert_allclose(audio["a"], audio["b"], atol=BATCH_ATOL, rtol=0)
    _submit(engine, "c", windows, _clip(4))  # a later stream finds it still prepared
    _run(engine)
    assert engine.voices.num_prepared == 1
    assert engine.resource_counts()["voice_users"] == 0 and engine.resource_counts()["voice_cache"] == 1


def test_eviction_drops_the_least_recently_used_idle_voice(token2wav, default_voice) -> None:
    engine = Code2WavEngine(token2wav, default_voice, voice_cache_size=2)
    windows = _windows(5, 30)
    for seed in (6, 7, 8):
        _submit(engine, f"s{seed}", windows, _clip(seed))
        _run(engine)
    assert len(engine.voices) == 2 and voice_key(_clip(6)) not in engine.voices
    assert voice_key(_clip(7)) in engine.voices and voice_key(_clip(8)) in engine.voices
    _submit(engine, "again", windows, _clip(6))
    _run(engine)
    assert engine.voices.num_prepared == 4 and voice_key(_clip(7)) not in engine.voices


def test_voices_in_use_are_kept_over_capacity_and_freed_when_their_streams_end(token2wav, default_voice) -> None:
    engine = Code2WavEngine(token2wav, default_voice, voice_cache_size=1)
    windows = _windows(9, 60)
    for seed in (10, 11, 12):
        _submit(engine, f"s{seed}", windows, _clip(seed))
    engine.step()
    assert engine.resource_counts()["voice_cache"] == 3 and engine.resource_counts()["voice_users"] == 3
    engine.submit(Code2WavRequest("s10", 0, 0, np.zeros(0, np.int32), action=ACTION_STOP))  # cancel
    _submit(engine, "s11", [CodecWindow(1, 0, tuple(range(28)), 3, False, False)], _clip(13))  # a new epoch
    engine.step()
    assert engine.resource_counts()["voice_users"] == 2  # s10 stopped
    _run(engine)  # s11's new epoch moved it to the voice of clip 13, s12 finished
    assert engine.resource_counts() == {"codec_states": 1, "codec_sequences": 2, "codec_pending": 0,
                                        "codec_slot_waits": 0, "voice_cache": 1, "voice_users": 1, "cuda_graphs": 0,
                                        "graph_eager_calls": 0}  # fmt: skip
    engine.release("s11")
    assert engine.resource_counts()["voice_users"] == 0 and len(engine.voices) == 1


def test_a_failed_forward_releases_the_voices_of_its_streams(token2wav, default_voice, monkeypatch) -> None:
    engine = Code2WavEngine(token2wav, default_voice)
    _submit(engine, "a", _windows(14, 30), _clip(14))

    def boom(_windows):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(token2wav, "decode", boom)
    assert engine.step()[0].error.startswith("internal")
    assert engine.resource_counts()["voice_users"] == 0 and engine.num_states() == 0


def test_eight_streams_with_eight_voices_in_one_forward_equal_separate_runs(token2wav, default_voice) -> None:
    engine = Code2WavEngine(token2wav, default_voice)
    plans = {f"s{i}": (_windows(20 + i, 30 + 11 * i), _clip(20 + i)) for i in range(8)}
    for request_id, (windows, ref) in plans.items():
        _submit(engine, request_id, windows, ref)
    first = engine.step()
    assert len(first) == 8 and engine.resource_counts()["voice_cache"] == 8
    audio = _run(engine)
    for request_id, (windows, ref) in plans.items():
        got = np.concatenate([next(r.audio for r in first if r.request_id == request_id), audio[request_id]])
        voice = token2wav.voice_from_audio(torch.from_numpy(ref), 16000)
        np.testing.assert_allclose(got, _alone(token2wav, voice, windows), atol=BATCH_ATOL, rtol=0)
    assert engine.resource_counts()["voice_users"] == 0


@pytest.mark.parametrize("ref,chunk_seq,match", [
    (np.zeros(100, np.float32), 0, "samples"),
    (np.full(16000, np.nan, np.float32), 0, "NaN"),
    (np.full(16000, 1.5, np.float32), 0, r"\[-1, 1\]"),
    (np.zeros(31 * 16000, np.float32), 0, "samples"),
    (np.zeros(16000, np.float64), 0, "float32"),
    (np.zeros((2, 8000), np.float32), 0, "float32"),
    (np.zeros(16000, np.float32), 1, "first window"),
])
def test_bad_references_are_invalid_arguments_of_that_request(token2wav, default_voice, ref, chunk_seq, match):
    service = Code2WavService(Code2WavEngine(token2wav, default_voice))
    bad, good = ListSink(), ListSink()
    if chunk_seq:
        service.submit(Code2WavRequest("bad", 0, 0, np.arange(28, dtype=np.int32)), ListSink())
    service.submit(Code2WavRequest("bad", 0, chunk_seq, np.arange(28, dtype=np.int32), ref_audio=ref), bad)
    service.submit(Code2WavRequest("good", 0, 0, np.arange(28, dtype=np.int32), ref_audio=_clip(30)), good)
    while service.has_work():
        service.step()
    assert bad.error.code == "invalid_argument" and bad.error.message.startswith(ERROR_REF_AUDIO)
    assert re.search(match, bad.error.message)
    assert good.error is None and good.results[0].audio.size > 0
    assert service.engine.voices.num_prepared == 1  # the bad reference was never prepared


def test_ref_audio_travels_as_an_optional_float32_tensor() -> None:
    request = Code2WavRequest("r", 0, 0, np.arange(28, dtype=np.int32), ref_audio=_clip(1))
    arrays = to_arrays(request)
    back = from_arrays(Code2WavRequest, arrays.get)
    np.testing.assert_array_equal(back.ref_audio, request.ref_audio)
    assert from_arrays(Code2WavRequest, {k: v for k, v in arrays.items() if k != "REF_AUDIO"}.get).ref_audio.size == 0
    with pytest.raises(ContractError, match="REF_AUDIO must be float32"):
        from_arrays(Code2WavRequest, {**arrays, "REF_AUDIO": arrays["REF_AUDIO"].astype(np.int16)}.get)


def test_voice_cache_release_of_an_unused_voice_is_an_error() -> None:
    cache = VoiceCache(builder=None, capacity=1)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        cache.release("nope")
    with pytest.raises(ValueError):
        VoiceCache(builder=None, capacity=0)  # type: ignore[arg-type]


def test_a_voice_prepared_while_serving_runs_its_prompt_eagerly(token2wav: Token2Wav) -> None:
    """With CUDA graphs on, a session's voice must not capture a graph for its prompt pass."""
    decoder = token2wav.flow.decoder

    def graphed(_inputs):
        raise AssertionError("the prompt pass went through the graphed solver")

    decoder.solver = graphed
    try:
        voice = token2wav.voice_from_audio(torch.from_numpy(_clip(40)), 16000)
        assert decoder.solver is graphed
    finally:
        decoder.solver = decoder.solve
    assert voice.prompt.num_mel_frames == 300
