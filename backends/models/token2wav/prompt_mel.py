"""The prompt mel of a voice (the flow's `cond` at setup), docs/model_facts.md#code2wav-token2wav.

24 kHz mono in; n_fft 1920, hop 480, periodic Hann window of 1920, reflect padding of 720 on
both sides and no centring, magnitude sqrt(re^2 + im^2 + 1e-9), 80 Slaney-scale,
area-normalised mel filters from 0 to 8 kHz (librosa's defaults), then log(max(., 1e-5)).
A clip of L samples gives L // 480 frames: 50 per second.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SAMPLE_RATE = 24000
N_FFT = 1920
HOP = 480
NUM_MELS = 80
F_MAX = 8000.0
_MAGNITUDE_EPS = 1e-9
_LOG_FLOOR = 1e-5

# Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per
# factor 6.4).
_HZ_PER_MEL = 200.0 / 3.0
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _HZ_PER_MEL
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    above = _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP
    return np.where(hz >= _BREAK_HZ, above, hz / _HZ_PER_MEL)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    above = _BREAK_HZ * np.exp(_LOG_STEP * (mel - _BREAK_MEL))
    return np.where(mel >= _BREAK_MEL, above, mel * _HZ_PER_MEL)


def slaney_filterbank(sample_rate: int, n_fft: int, num_mels: int, f_min: float,
                      f_max: float) -> torch.Tensor:
    """Triangles between mel-spaced edges, each scaled to unit area over Hz:
    [num_mels, n_fft // 2 + 1] float32 (built in float64)."""
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(f_min)), _hz_to_mel(np.array(f_max)),
                                   num_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return torch.from_numpy(triangles * (2.0 / (edges[2:] - edges[:-2]))[:, None]).float()


class PromptMel:
    """Window and filters built once; `__call__` maps audio to the prompt mel."""

    def __init__(self) -> None:
        self.window = torch.hann_window(N_FFT)  # [N_FFT] float32, periodic
        self.filters = slaney_filterbank(SAMPLE_RATE, N_FFT, NUM_MELS, 0.0, F_MAX)  # [80, 961]

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """audio: [L] float32 at 24 kHz, L > 720 -> [L // 480, 80] float32 log mel."""
        pad = (N_FFT - HOP) // 2
        padded = torch.nn.functional.pad(audio[None, None], (pad, pad), mode="reflect")[0, 0]
        spec = torch.stft(padded, N_FFT, HOP, N_FFT, window=self.window, center=False,
                          return_complex=True)
        magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + _MAGNITUDE_EPS)
        return torch.log(torch.clamp(self.filters @ magnitude, min=_LOG_FLOOR)).T
