"""Token2Wav streaming (docs/model_facts.md#code2wav-windows) on the tiny random model, and the
whole stream against the reference's `Token2wav.stream`.

Strategy:
- parity: the reference's setup + `inference_chunk` + cache cuts + HiFT overlap-add (its
  `stream()` logic, which hard-codes CUDA, re-run on CPU) against `decode` window by window,
  with the reference's HiFT noise draws injected into ours;
- contract: windows cut by the real `CodecWindowBridge`; sample counts are exact (first 20160,
  steady 24000, final = the rest, 960 per decoded code);
- batching: 8 streams at different stages in one call against 8 single-stream runs;
- streaming vs whole: the HiFT over the whole streamed mel with the same source noise, against
  the streamed audio: equal outside the cross-fade spans, a stated bound inside. (The flow is
  chunk-causal by design, so "whole" means the whole mel of the stream; the HiFT is unvoiced
  here because the reference restarts the sine phase every window, which is compared by the
  parity test instead);
- joins: no sample step at a window boundary beyond a stated click bound.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.models.speech_codes import SILENCE_CODE
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice, VoicePrompt
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from stepaudio2_reference import reference_noise

SAMPLES_PER_CODE = 960  # 2 mel frames x 480 samples at 24 kHz
HELD = 3840  # 8 mel frames held back for the cross-fade
# Measured <= 2e-7 on the audio (mel and caches within 1.2e-6 of the reference's); a wrong
# cache cut, noise offset or fade is > 1e-3.
PARITY_ATOL = 1e-5
# Padded rows take other kernel shapes: float32 summation order only, ~5e-7 on the mel, which
# the random HiFT (exp magnitudes, F0 -> accumulated phase) amplifies to at most ~1e-4 on
# audio peaking at ~0.1 (measured); sharing state between rows differs at the signal level.
BATCH_ATOL = 5e-4
# Outside the cross-fade spans streaming equals the whole-mel HiFT to float32 rounding
# (measured 1e-7). Inside, the two Hamming halves sum to up to 1.08 and the faded-out tail was
# rendered without right context: measured up to 0.21 x the local peak.
WHOLE_ATOL = 1e-6
CROSSFADE_REL = 0.25
# Hamming(7680) starts at 0.08: at a join the new window enters with weight 0.08 on top of the
# held tail, which continues the previous window sample for sample. A join may therefore step
# by at most one ordinary sample step plus 0.08 x the peak amplitude (1.08 allows for the
# not power-complementary halves); a misaligned or missing tail jumps by the full amplitude.
HAMMING_FLOOR = 0.08
MAX_WINDOW_SECONDS = 0.1  # the CPU real-time budget; measured ~43 ms of CPU time on one core
BF16_MEL_REL = 0.02


def _windows(codes: list[int], unit_ends: tuple[int, ...] = ()) -> list[CodecWindow]:
    """Bridge windows for `codes`, with non-terminal unit ends after the given frame counts."""
    bridge, windows, start = CodecWindowBridge(), [], 0
    for stop in (*unit_ends, len(codes)):
        windows += bridge.push(codes[start:stop])
        windows += bridge.end_unit() if stop != len(codes) else []
        start = stop
    return windows + bridge.end_turn()


def _window(stream, window: CodecWindow) -> StreamWindow:
    return StreamWindow(stream, np.array(window.codes, np.int32), window.last_chunk)


def _decode_stream(model: Token2Wav, voice: Voice, windows: list[CodecWindow]) -> list[np.ndarray]:
    stream = model.new_stream(voice)
    return [model.decode([_window(stream, w)])[0] for w in windows]


def _codes(seed: int, count: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 6561, count).tolist()


def test_stream_equals_reference_token2wav_stream(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """40-code prompt (P = 80: both cache cuts fire from the third window), 5 steady windows
    and a final one."""
    prompt = random_voice_prompt(5, num_codes=40)
    windows = _windows(_codes(6, 130))
    stream = pair.ours.new_stream(pair.ours.prepare_voice(prompt))
    reference = _ReferenceStream(pair, prompt)
    for index, window in enumerate(windows):
        expected, noise = reference.window(list(window.codes), window.last_chunk, seed=100 + index)
        monkeypatch.setattr(pair.ours, "_source_noise", lambda s, frames, n=noise: n[0])
        got = pair.ours.decode([_window(stream, window)])[0]
        np.testing.assert_allclose(got, expected, atol=PARITY_ATOL, rtol=0)


class _ReferenceStream:
    """`stepaudio2.Token2wav.set_stream_cache` + `stream()` (fp32), on CPU."""

    def __init__(self, pair, prompt: VoicePrompt) -> None:
        self.flow, self.hift, self.speaker = pair.ref_flow, pair.ref_hift, prompt.speaker[None]
        self.prompt_frames = prompt.mel.shape[0]
        lookahead = torch.full((3,), SILENCE_CODE)
        with torch.inference_mode():
            cache = self.flow.setup_cache(torch.cat([prompt.codes, lookahead])[None],
                                          prompt.mel[None], self.speaker, 10)
        self.cache = {k: v.clone() for k, v in cache.items()}  # views of reused buffers
        self.mel, self.source, self.speech = torch.zeros(1, 80, 0), torch.zeros(1, 1, 0), torch.zeros(1, 0)
        self.fade = torch.from_numpy(np.hamming(2 * HELD))

    @torch.inference_mode()
    def window(self, codes: list[int], last: bool, seed: int) -> tuple[np.ndarray, torch.Tensor]:
        mel, cache = self.flow.inference_chunk(torch.tensor([codes]), self.speaker, self.cache, last, 10)
        self.cache = {k: self._cut(k, v.clone()) for k, v in cache.items()}
        mel = torch.cat([self.mel, mel], dim=2)
        noise = reference_noise(seed, mel.shape[2])
        torch.manual_seed(seed)
        speech, source = self.hift(mel, self.source)
        if self.speech.shape[-1]:
            speech = speech.clone()
            speech[:, :HELD] = speech[:, :HELD] * self.fade[:HELD] + self.speech * self.fade[HELD:]
        self.mel, self.source, self.speech = mel[..., -8:], source[..., -HELD:], speech[:, -HELD:]
        return (speech if last else speech[:, :-HELD])[0].numpy(), noise

    def _cut(self, key: str, cache: torch.Tensor) -> torch.Tensor:
        dim = {"estimator_att_cache": 4, "conformer_att_cache": 3}.get(key)
        if dim is None or cache.shape[dim] <= self.prompt_frames + 100:
            return cache
        length = cache.shape[dim]
        return torch.cat([cache.narrow(dim, 0, self.prompt_frames),
                          cache.narrow(dim, length - 100, 100)], dim=dim)


def test_emitted_sample_counts(token2wav: Token2Wav, voice: Voice) -> None:
    chunks = _decode_stream(token2wav, voice, _windows(_codes(0, 103)))
    assert [len(c) for c in chunks] == [20160, 24000, 24000, 24000, HELD + 6 * SAMPLES_PER_CODE]
    assert sum(len(c) for c in chunks) == SAMPLES_PER_CODE * (3 + 103)


@pytest.mark.parametrize("unit_ends", [(7,), (30, 37), (24, 49, 53)])
def test_total_is_960_per_decoded_code(token2wav: Token2Wav, voice: Voice,
                                       unit_ends: tuple[int, ...]) -> None:
    """Unit-end flushes of odd sizes still emit 960 samples per new code (after the first
    window's held tail), and the final flush drains everything."""
    windows = _windows(_codes(1, 60), unit_ends)
    chunks = _decode_stream(token2wav, voice, windows)
    for window, chunk in zip(windows[1:-1], chunks[1:-1]):
        assert len(chunk) == SAMPLES_PER_CODE * window.num_new_frames
    assert sum(len(c) for c in chunks) == SAMPLES_PER_CODE * (3 + 60)


def test_final_window_may_be_left_context_only(token2wav: Token2Wav, voice: Voice) -> None:
    windows = _windows(_codes(2, 50))
    assert windows[-1].num_new_frames == 0
    chunks = _decode_stream(token2wav, voice, windows)
    assert len(chunks[-1]) == HELD + 3 * SAMPLES_PER_CODE


def test_batch_of_8_streams_equals_separate_runs(token2wav: Token2Wav, voice: Voice) -> None:
    """Streams at different stages (first, steady, pruned, short unit-end, final) share one
    forward; every stream's caches, noise offsets and HiFT state stay its own."""
    plans = [_windows(_codes(10 + i, 20 + 13 * i), (5 + 3 * i,)) for i in range(8)]
    expected = [_decode_stream(token2wav, voice, windows) for windows in plans]
    streams = [token2wav.new_stream(voice) for _ in plans]
    got: list[list[np.ndarray]] = [[] for _ in plans]
    for step in range(max(len(p) for p in plans)):
        live = [i for i, p in enumerate(plans) if step < len(p)]
        batch = [_window(streams[i], plans[i][step]) for i in live]
        for i, audio in zip(live, token2wav.decode(batch)):
            got[i].append(audio)
    for mine, theirs in zip(got, expected):
        assert [len(c) for c in mine] == [len(c) for c in theirs]
        np.testing.assert_allclose(np.concatenate(mine), np.concatenate(theirs),
                                   atol=BATCH_ATOL, rtol=0)


def test_streaming_equals_whole_mel_synthesis_up_to_the_crossfade(voice: Voice,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_token2wav(Token2WavConfig.tiny(), seed=3)
    with torch.no_grad():  # F0 = 0 everywhere: the source is the (aligned) noise only
        model.hift.f0_predictor.classifier.weight.zero_()
        model.hift.f0_predictor.classifier.bias.zero_()
    windows = _windows(_codes(7, 110))
    noise = torch.randn(2 * 113 * 480, 9, generator=torch.Generator().manual_seed(1))
    mels, chunks, stream, first_frame = [], [], model.new_stream(voice), 0
    run_flow = model._run_flow

    def recording_flow(batch):
        mel, frames, settle = run_flow(batch)
        mels.append(mel[0, :, : frames[0]].clone())
        return mel, frames, settle

    monkeypatch.setattr(model, "_run_flow", recording_flow)
    for window in windows:
        start = first_frame - stream.mel_cache.shape[1]  # the HiFT input starts 8 frames back
        monkeypatch.setattr(model, "_source_noise",
                            lambda s, frames, a=start: noise[a * 480 : (a + frames) * 480])
        chunks.append(model.decode([_window(stream, window)])[0])
        first_frame += mels[-1].shape[1]
    with torch.inference_mode():
        whole, _ = model.hift(torch.cat(mels, dim=1)[None], [torch.zeros(0)], noise[None])
    whole, audio = whole[0].numpy(), np.concatenate(chunks)
    assert len(whole) == len(audio)
    in_span = np.zeros(len(audio), dtype=bool)
    for join in np.cumsum([len(c) for c in chunks])[:-1]:
        in_span[join : join + HELD] = True
    error = np.abs(whole - audio)
    assert error[~in_span].max() <= WHOLE_ATOL, error[~in_span].max()
    bound = CROSSFADE_REL * np.abs(whole).max()
    assert error[in_span].max() <= bound, (error[in_span].max(), bound)


def test_chunks_join_without_clicks(token2wav: Token2Wav, voice: Voice) -> None:
    chunks = _decode_stream(token2wav, voice, _windows(_codes(3, 128)))
    audio = np.concatenate(chunks)
    steps = np.abs(np.diff(audio))
    joins = np.cumsum([len(c) for c in chunks])[:-1]
    inside = np.delete(steps, joins - 1)
    bound = inside.max() + 1.08 * HAMMING_FLOOR * np.abs(audio).max()
    assert steps[joins - 1].max() <= bound, (steps[joins - 1], bound)
    assert np.abs(audio).max() < 0.99  # the random weights do not clip, or joins prove nothing


def test_decoding_is_deterministic(token2wav: Token2Wav, voice: Voice) -> None:
    windows = _windows(_codes(4, 40))
    first, second = _decode_stream(token2wav, voice, windows), _decode_stream(token2wav, voice, windows)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_malformed_windows_are_rejected(token2wav: Token2Wav, voice: Voice) -> None:
    stream = token2wav.new_stream(voice)
    with pytest.raises(ValueError, match="chunk_below_lookahead_window"):
        token2wav.decode([StreamWindow(stream, np.array([1, 2, 3], np.int32), False)])
    with pytest.raises(ValueError, match="codes must lie"):
        token2wav.decode([StreamWindow(stream, np.array([1, 2, 3, 6561], np.int32), False)])
    window = StreamWindow(stream, np.arange(10, dtype=np.int32), False)
    with pytest.raises(ValueError, match="once per decode"):
        token2wav.decode([window, window])
    token2wav.decode([StreamWindow(stream, np.arange(10, dtype=np.int32), True)])
    with pytest.raises(ValueError, match="already finished"):
        token2wav.decode([window])


def test_empty_final_window_flushes_the_held_tail(token2wav: Token2Wav, voice: Voice) -> None:
    stream = token2wav.new_stream(voice)
    token2wav.decode([StreamWindow(stream, np.arange(28, dtype=np.int32), False)])
    (tail,) = token2wav.decode([StreamWindow(stream, np.zeros(0, np.int32), True)])
    assert len(tail) == HELD


def test_the_voice_changes_the_audio(token2wav: Token2Wav, voice: Voice) -> None:
    codes = np.arange(28, dtype=np.int32)
    default = token2wav.decode([StreamWindow(token2wav.new_stream(voice), codes, False)])[0]
    other_prompt = VoicePrompt(voice.prompt.codes, voice.prompt.mel, -voice.prompt.speaker)
    other_voice = token2wav.prepare_voice(other_prompt)
    other = token2wav.decode([StreamWindow(token2wav.new_stream(other_voice), codes, False)])[0]
    assert np.abs(default - other).max() > 1e-3


def test_a_stream_normalizes_its_speaker_once_as_a_window_did(token2wav: Token2Wav, voice: Voice) -> None:
    """`new_stream` keeps the voice's normalized speaker, bit for bit the row a batched
    `normalize_speaker` gives; decode projects it with the flow's affine layer per window."""
    speakers = torch.stack([-voice.prompt.speaker, voice.prompt.speaker, 2 * voice.prompt.speaker])
    with torch.inference_mode():
        batched = token2wav.flow.normalize_speaker(speakers)
    stream = token2wav.new_stream(voice)
    assert stream.speaker.shape == (192,) and torch.equal(stream.speaker, batched[1])
    codes = np.arange(28, dtype=np.int32)
    default = token2wav.decode([StreamWindow(stream, codes, False)])[0]
    other = token2wav.new_stream(voice)
    other.speaker = -other.speaker
    assert np.abs(default - token2wav.decode([StreamWindow(other, codes, False)])[0]).max() > 1e-3


def test_one_window_is_fast(token2wav: Token2Wav, voice: Voice) -> None:
    stream = token2wav.new_stream(voice)
    codes = np.arange(28, dtype=np.int32)
    token2wav.decode([StreamWindow(stream, codes, False)])  # warm-up
    timings = []
    for _ in range(5):  # CPU time: the CI box's other processes do not count against us
        start = time.process_time()
        token2wav.decode([StreamWindow(stream, codes, False)])
        timings.append(time.process_time() - start)
    assert min(timings) < MAX_WINDOW_SECONDS, timings


def test_bfloat16_flow_stays_close_to_float32() -> None:
    """The reference's `float16=True` counterpart: flow weights, caches and noise in bfloat16,
    the HiFT in float32. bfloat16 keeps 8 mantissa bits: measured 0.65% relative error on the
    mel of a first window; a dtype slip (a float32 cache concatenated, a wrong cast) raises."""
    prompt = random_voice_prompt(0)
    codes = np.random.default_rng(0).integers(0, 6561, 28).astype(np.int32)
    mels = []
    for dtype in (torch.float32, torch.bfloat16):
        model = random_token2wav(Token2WavConfig.tiny(), seed=0)
        model.set_flow_dtype(dtype)
        stream = model.new_stream(model.prepare_voice(prompt))
        with torch.inference_mode():
            mel, _, settle = model._run_flow([StreamWindow(stream, codes, False)])
            settle()
        assert model.decode([StreamWindow(stream, codes, True)])[0].dtype == np.float32
        mels.append(mel.float())
    relative = float((mels[1] - mels[0]).norm() / mels[0].norm())
    assert relative < BF16_MEL_REL, relative
