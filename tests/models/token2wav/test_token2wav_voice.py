"""The voice prompt (`voice`, `voice_standin`, `prompt_mel`, `resample`): the reference's prompt
mel recipe, the prompt length rule, and the documented stand-ins for the S3 tokenizer and
campplus (the real ones: test_token2wav_voice_onnx.py).

Strategy: the prompt mel is compared with the reference's `mel_spectrogram` (stepaudio2
flashcosyvoice.utils.audio) with librosa's filter function replaced by ours, and our Slaney
filters with the Whisper ones already checked against transformers (equal when both span
0..Nyquist); the resampler with an analytic sine; the stand-ins for shape, determinism and
dependence on the voice.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import numpy as np
import pytest
import torch

from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.models.token2wav.prompt_mel import PromptMel, slaney_filterbank
from backends.models.token2wav.resample import resample
from backends.models.token2wav.voice import build_voice_prompt
from backends.models.token2wav.voice_standin import StandinVoiceEncoder
from backends.models.whisper_mel import slaney_mel_filters
from stepaudio2_reference import REFERENCE_PACKAGE, load_reference, missing_reason

FILTER_ATOL = 1e-7  # both built in float64, cast once
MEL_ATOL = 1e-4  # log mel: float32 STFT rounding near the 1e-5 floor; a framing error is > 0.1
RESAMPLE_ATOL = 2e-3  # a 6-zero-crossing Hann sinc passes 440 Hz with ~1e-4 ripple (measured)
EDGE = 64  # samples at each end where the kernel reads the zero padding
STANDINS = StandinVoiceEncoder(6561, 192)


def _clip(seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(synthesize_reference_voice(seed)).float()


def test_filters_equal_whisper_slaney_filters_over_the_full_band() -> None:
    ours = slaney_filterbank(16000, 400, 80, 0.0, 8000.0)
    torch.testing.assert_close(ours.T, slaney_mel_filters(80, 400, 16000), atol=FILTER_ATOL, rtol=0)


def test_prompt_mel_equals_reference_mel_spectrogram(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    load_reference()  # registers the package namespace
    filters = types.ModuleType("librosa.filters")
    filters.mel = lambda sr, n_fft, n_mels, fmin, fmax: slaney_filterbank(sr, n_fft, n_mels, fmin, fmax).numpy()
    librosa = types.ModuleType("librosa")
    librosa.filters = filters
    monkeypatch.setitem(sys.modules, "librosa", librosa)
    monkeypatch.setitem(sys.modules, "librosa.filters", filters)
    audio = importlib.import_module(f"{REFERENCE_PACKAGE}.flashcosyvoice.utils.audio")
    clip = resample(_clip(), 16000, 24000)[: 24000 * 2]
    expected = audio.mel_spectrogram(clip[None]).transpose(1, 2)[0]  # [T, 80]
    got = PromptMel()(clip)
    assert got.shape == (100, 80)
    torch.testing.assert_close(got, expected, atol=MEL_ATOL, rtol=0)


def test_resample_keeps_a_sine() -> None:
    t_in = torch.arange(16000, dtype=torch.float64) / 16000
    out = resample(torch.sin(2 * math.pi * 440 * t_in).float(), 16000, 24000)
    t_out = torch.arange(24000, dtype=torch.float64) / 24000
    expected = torch.sin(2 * math.pi * 440 * t_out).float()
    assert out.shape == (24000,)
    torch.testing.assert_close(out[EDGE:-EDGE], expected[EDGE:-EDGE], atol=RESAMPLE_ATOL, rtol=0)
    with pytest.raises(ValueError, match="sample rates"):
        resample(out, 0, 16000)


def test_prompt_shapes_and_length_rule() -> None:
    """6 s -> 150 codes and 300 mel frames; a short clip is zero-padded to the same size."""
    full = build_voice_prompt(_clip(), 16000, 6.0, STANDINS)
    short = build_voice_prompt(_clip()[:16000], 16000, 6.0, STANDINS)
    for prompt in (full, short):
        assert prompt.codes.shape == (150,) and prompt.codes.dtype == torch.int64
        assert prompt.mel.shape == (300, 80) and prompt.speaker.shape == (192,)
        assert 0 <= int(prompt.codes.min()) and int(prompt.codes.max()) < 6561
    assert prompt.num_mel_frames == 300


def test_standins_are_deterministic_and_follow_the_voice() -> None:
    first = build_voice_prompt(_clip(0), 16000, 6.0, STANDINS)
    again = build_voice_prompt(_clip(0), 16000, 6.0, STANDINS)
    other = build_voice_prompt(_clip(1), 16000, 6.0, STANDINS)
    assert torch.equal(first.codes, again.codes) and torch.equal(first.speaker, again.speaker)
    assert (first.codes != other.codes).float().mean() > 0.5
    cosine = torch.nn.functional.cosine_similarity(first.speaker, other.speaker, dim=0)
    assert cosine < 0.999
    assert len(set(first.codes.tolist())) > 20  # not a constant code


def test_prompt_mel_is_the_whole_clip_mel_cut_to_the_prompt() -> None:
    """A clip longer than 6 s: its first 300 frames as the reference computes them over the whole
    clip (the last frame reads real samples, not a reflection at the 6 s cut)."""
    long_clip = torch.from_numpy(synthesize_reference_voice(2, 16000, 6.5)).float()
    prompt = build_voice_prompt(long_clip, 16000, 6.0, STANDINS)
    whole = PromptMel()(resample(long_clip, 16000, 24000))
    torch.testing.assert_close(prompt.mel, whole[:300], atol=0, rtol=0)
    cut = PromptMel()(resample(long_clip, 16000, 24000)[:144000])
    assert (cut[-1] - prompt.mel[-1]).abs().max() > 1e-3 and torch.equal(cut[:-2], prompt.mel[:-2])
    assert np.isfinite(prompt.mel.numpy()).all()
