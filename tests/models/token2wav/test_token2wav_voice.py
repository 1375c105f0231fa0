"""The voice prompt (`voice`, `prompt_mel`, `resample`): the reference's prompt mel recipe, the
documented stand-ins for the S3 tokenizer and campplus, and the `voice.pt` override.

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
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.models.token2wav.prompt_mel import PromptMel, slaney_filterbank
from backends.models.token2wav.resample import resample
from backends.models.token2wav.voice import VOICE_FILE, build_voice_prompt
from backends.models.whisper_mel import slaney_mel_filters
from stepaudio2_reference import REFERENCE_PACKAGE, load_reference, missing_reason

FILTER_ATOL = 1e-7  # both built in float64, cast once
MEL_ATOL = 1e-4  # log mel: float32 STFT rounding near the 1e-5 floor; a framing error is > 0.1
RESAMPLE_ATOL = 2e-3  # a 6-zero-crossing Hann sinc passes 440 Hz with ~1e-4 ripple (measured)
EDGE = 64  # samples at each end where the kernel reads the zero padding


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
    full = build_voice_prompt(_clip(), 16000, 6.0, 6561, 192)
    short = build_voice_prompt(_clip()[:16000], 16000, 6.0, 6561, 192)
    for prompt in (full, short):
        assert prompt.codes.shape == (150,) and prompt.codes.dtype == torch.int64
        assert prompt.mel.shape == (300, 80) and prompt.speaker.shape == (192,)
        assert 0 <= int(prompt.codes.min()) and int(prompt.codes.max()) < 6561
    assert prompt.num_mel_frames == 300


def test_standins_are_deterministic_and_follow_the_voice() -> None:
    first = build_voice_prompt(_clip(0), 16000, 6.0, 6561, 192)
    again = build_voice_prompt(_clip(0), 16000, 6.0, 6561, 192)
    other = build_voice_prompt(_clip(1), 16000, 6.0, 6561, 192)
    assert torch.equal(first.codes, again.codes) and torch.equal(first.speaker, again.speaker)
    assert (first.codes != other.codes).float().mean() > 0.5
    cosine = torch.nn.functional.cosine_similarity(first.speaker, other.speaker, dim=0)
    assert cosine < 0.999
    assert len(set(first.codes.tolist())) > 20  # not a constant code


def test_voice_file_overrides_the_standins(tmp_path: Path) -> None:
    speaker = torch.arange(192, dtype=torch.float32)
    torch.save({"speech_tokens": [5, 6, 7], "spk_embedding": speaker}, tmp_path / VOICE_FILE)
    prompt = build_voice_prompt(_clip(), 16000, 0.2, 6561, 192, override=tmp_path / VOICE_FILE)
    assert prompt.codes.tolist() == [5, 6, 7, 7, 7]  # 0.2 s = 5 codes: padded with the last
    assert torch.equal(prompt.speaker, speaker)
    torch.save({"speech_tokens": [1], "spk_embedding": torch.zeros(3)}, tmp_path / VOICE_FILE)
    with pytest.raises(ValueError, match="spk_embedding"):
        build_voice_prompt(_clip(), 16000, 0.2, 6561, 192, override=tmp_path / VOICE_FILE)
    assert np.isfinite(prompt.mel.numpy()).all()
