"""The voice models' front ends: the Kaldi fbank (campplus' input) and the S3 tokenizer's 128-bin
log-mel.

Strategy: the fbank against torchaudio's `compliance.kaldi.fbank` live where torchaudio is
installed (it is not a runtime or CI dependency), and always against values recorded once from
torchaudio 2.11's implementation on an analytic signal (a sum of 60 sines, every mel bin well
above float32 noise; float64 moves them by 1.2e-5); the log-mel's filters against s3tokenizer's
stored ones (live, where installed) and transformers' Slaney filters, and the log-mel against the
line-by-line port of s3tokenizer's function in `voice_reference`.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.models.token2wav.kaldi_fbank import KaldiFbank
from backends.models.token2wav.s3_log_mel import S3LogMel
from voice_reference import log_mel_spectrogram, s3tokenizer_filters, slaney_filters_128

RECORDED_ATOL = 1e-4  # float32 FFT rounding across builds; a wrong step moves values by > 0.01
FILTER_ATOL = 1e-8
MEL_ATOL = 1e-5  # the same float32 ops in the same order: equal up to matmul blocking

# torchaudio 2.11 kaldi.fbank(num_mel_bins=80, dither=0, sample_frequency=16000) of
# `_sines()`: frames 0 and 4, every 4th bin
RECORDED_FBANK = torch.tensor([
    [-7.76049, -5.92089, -3.62956, -2.54056, -2.19765, -2.99353, -0.90868, -1.17779, 0.22746, 0.60733,
     0.65281, 1.46045, 1.79000, 2.15638, 2.51628, 2.91162, 3.21967, 3.57722, 3.80501, 4.03957],
    [-7.89796, -5.98430, -3.60423, -2.55641, -2.20539, -3.08609, -0.92938, -1.14292, 0.22376, 0.61054,
     0.61928, 1.46535, 1.78238, 2.14238, 2.51982, 2.91902, 3.22185, 3.56809, 3.80632, 4.03780],
])


def _sines(num_samples: int = 1040) -> torch.Tensor:
    n = torch.arange(num_samples, dtype=torch.float64)[:, None]
    k = torch.arange(60, dtype=torch.float64)[None]
    return (0.02 * torch.sin(2 * math.pi * (100 + 130 * k) * n / 16000 + 0.7 * k * k)).sum(1).float()


def _voice(seconds: float = 2.0) -> torch.Tensor:
    return torch.from_numpy(synthesize_reference_voice(3, 16000, seconds)).float()


def test_fbank_matches_values_recorded_from_torchaudio() -> None:
    features = KaldiFbank()(_sines())
    assert features.shape == (5, 80)  # 1 + (1040 - 400) // 160
    torch.testing.assert_close(features[::4, ::4], RECORDED_FBANK, atol=RECORDED_ATOL, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("torchaudio") is None,
                    reason="torchaudio (the fbank oracle) is not installed")
@pytest.mark.parametrize("clip", ["voice", "sines", "silence_tail"])
def test_fbank_equals_torchaudio(clip: str) -> None:
    import torchaudio.compliance.kaldi as kaldi

    clips = {"voice": _voice(), "sines": _sines(),
             "silence_tail": torch.cat([_voice(0.1), torch.zeros(3000)])}
    audio = clips[clip]
    expected = kaldi.fbank(audio[None], num_mel_bins=80, dither=0, sample_frequency=16000)
    torch.testing.assert_close(KaldiFbank()(audio), expected, atol=1e-5, rtol=0)


def test_fbank_frame_count_and_short_clips() -> None:
    assert KaldiFbank()(_voice(1.0)).shape == (1 + (16000 - 400) // 160, 80)
    assert KaldiFbank()(torch.zeros(400)).shape == (1, 80)  # silence: the epsilon floor, finite
    with pytest.raises(ValueError, match="at least 400"):
        KaldiFbank()(torch.zeros(399))


def test_tokenizer_filters_equal_the_stored_and_the_slaney_ones() -> None:
    ours = S3LogMel().filters
    torch.testing.assert_close(ours, slaney_filters_128(), atol=FILTER_ATOL, rtol=0)
    stored = s3tokenizer_filters()
    if stored is not None:  # the package's own file, where it is installed
        torch.testing.assert_close(ours, stored, atol=FILTER_ATOL, rtol=0)


@pytest.mark.parametrize("num_samples", [96000, 96256, 32000 + 77])
def test_tokenizer_mel_equals_s3tokenizer_port(num_samples: int) -> None:
    audio = torch.from_numpy(synthesize_reference_voice(5, 16000, 7.0)).float()[:num_samples]
    got = S3LogMel()(audio)
    assert got.shape == (128, num_samples // 160)
    torch.testing.assert_close(got, log_mel_spectrogram(audio), atol=MEL_ATOL, rtol=0)
    with pytest.raises(ValueError, match="more than 200"):
        S3LogMel()(audio[:200])
