"""Whisper log-mel parity: our torch front end against transformers' WhisperFeatureExtractor.

Strategy: the extractor is the reference. The same random audio goes through both, at several
lengths (no padding: the extractor with padding="longest" on one clip), and through the
extractor's default 30 s padding against our spectrogram of the zero-padded clip. Frame-range
extraction (`raw_frames`) must equal the columns of the whole-clip result, edges included,
because the streaming front end is built on it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank

from backends.models.whisper_mel import (
    HOP_LENGTH,
    NUM_MEL_BINS,
    WhisperMel,
    normalize_log_mel,
    slaney_mel_filters,
)

# The extractor builds float64 filters and casts to float32; ours should round the same way.
FILTER_TOLERANCE = 1e-7
# Scaled log-mel ((log10 + 4) / 4): the same STFT on different segment layouts differs only
# in float32 rounding, far below the 0.25-per-decade scale of the features.
FEATURE_TOLERANCE = 2e-5


def _audio(num_samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tone = np.sin(np.arange(num_samples) * 2 * np.pi * 440 / 16000)
    return (0.3 * tone + 0.05 * rng.standard_normal(num_samples)).astype(np.float32)


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor()


@pytest.fixture(scope="module")
def mel() -> WhisperMel:
    return WhisperMel()


def test_filters_match_transformers() -> None:
    reference = mel_filter_bank(
        num_frequency_bins=201, num_mel_filters=80, min_frequency=0.0, max_frequency=8000.0,
        sampling_rate=16000, norm="slaney", mel_scale="slaney",
    )
    ours = slaney_mel_filters()
    assert ours.shape == (201, NUM_MEL_BINS) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, torch.from_numpy(reference).float(), rtol=0,
                               atol=FILTER_TOLERANCE)


@pytest.mark.parametrize("num_samples", [401, 1600, 12345, 16000, 16480, 80000])
def test_spectrogram_matches_extractor_without_padding(
    extractor: WhisperFeatureExtractor, mel: WhisperMel, num_samples: int
) -> None:
    audio = _audio(num_samples, seed=num_samples)
    reference = extractor(audio, sampling_rate=16000, padding="longest",
                          return_tensors="np").input_features[0]
    ours = mel.spectrogram(torch.from_numpy(audio))
    assert ours.shape == (NUM_MEL_BINS, num_samples // HOP_LENGTH) == reference.shape
    torch.testing.assert_close(ours, torch.from_numpy(reference), rtol=0, atol=FEATURE_TOLERANCE)


def test_spectrogram_matches_extractor_30s_padding(
    extractor: WhisperFeatureExtractor, mel: WhisperMel
) -> None:
    audio = _audio(3 * 16000, seed=3)
    reference = extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    padded = np.concatenate([audio, np.zeros(480000 - audio.shape[0], np.float32)])
    ours = mel.spectrogram(torch.from_numpy(padded))
    assert reference.shape == ours.shape == (NUM_MEL_BINS, 3000)
    torch.testing.assert_close(ours, torch.from_numpy(reference), rtol=0, atol=FEATURE_TOLERANCE)


@pytest.mark.parametrize("first,stop", [(0, 1), (0, 2), (1, 3), (37, 61), (95, 100), (99, 100)])
def test_raw_frames_equal_columns_of_the_whole_clip(mel: WhisperMel, first: int, stop: int) -> None:
    """A range touching either edge needs the same reflect padding as the whole clip; an
    off-by-one in the reflected samples shows up in frames 0, 1 and the last one."""
    samples = torch.from_numpy(_audio(16040, seed=7))  # 100 frames, last window reflected
    whole = mel.raw_frames(samples, 0, 100)
    torch.testing.assert_close(mel.raw_frames(samples, first, stop), whole[:, first:stop],
                               rtol=0, atol=FEATURE_TOLERANCE)


def test_raw_frames_empty_range(mel: WhisperMel) -> None:
    assert mel.raw_frames(torch.zeros(1000), 3, 3).shape == (NUM_MEL_BINS, 0)


def test_fixed_floor_normalisation() -> None:
    raw = torch.tensor([[-12.0, -10.0, -3.0, 0.5]])
    expected = torch.tensor([[-1.5, -1.5, 0.25, 1.125]])
    assert torch.equal(normalize_log_mel(raw, -10.0), expected)


@pytest.mark.parametrize("bad", [
    torch.zeros(200), torch.zeros(2, 800), torch.zeros(800, dtype=torch.float64),
])
def test_rejects_unusable_clips(mel: WhisperMel, bad: torch.Tensor) -> None:
    with pytest.raises(ValueError):
        mel.raw_frames(bad, 0, 1)


def test_rejects_frames_past_the_clip(mel: WhisperMel) -> None:
    with pytest.raises(ValueError, match="outside"):
        mel.raw_frames(torch.zeros(1600), 0, 11)
