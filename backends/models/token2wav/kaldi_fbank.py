"""Kaldi log mel filterbank features, the campplus speaker model's input.

The reference computes them with torchaudio's `compliance.kaldi.fbank(audio, num_mel_bins=80,
dither=0, sample_frequency=16000)`, every other option at its default; this is that computation
in plain torch, step for step, so the runtime needs no torchaudio:
- frames of 400 samples every 160 (25 ms / 10 ms at 16 kHz), only those that fit the clip
  (`snip_edges`): 1 + (L - 400) // 160 frames;
- per frame: subtract its mean, pre-emphasis x[j] - 0.97 x[max(j - 1, 0)], the "povey" window
  (a symmetric Hann window to the power 0.85), zero-pad to 512, power spectrum;
- 80 triangles equally spaced on Kaldi's mel scale 1127 ln(1 + f / 700) from 20 Hz to 8 kHz,
  evaluated at the 256 FFT bins below Nyquist (the Nyquist bin gets weight 0);
- natural log after a floor at float32's machine epsilon.
The samples are used as given ([-1, 1] floats, not rescaled to 16-bit integers), as in the
reference.
"""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 16000
FRAME_LENGTH = 400  # 25 ms
FRAME_SHIFT = 160  # 10 ms
FFT_SIZE = 512  # the frame length rounded up to a power of two
PREEMPHASIS = 0.97
POVEY_POWER = 0.85
LOW_HZ = 20.0
_EPSILON = torch.finfo(torch.float32).eps


def kaldi_mel_scale(hz: torch.Tensor | float) -> torch.Tensor | float:
    if isinstance(hz, torch.Tensor):
        return 1127.0 * (1.0 + hz / 700.0).log()
    return 1127.0 * math.log(1.0 + hz / 700.0)


def kaldi_mel_banks(num_bins: int) -> torch.Tensor:
    """[num_bins, FFT_SIZE // 2 + 1] float32 triangle weights (built in float32 like Kaldi's
    torch port, so the rounding matches)."""
    low, high = kaldi_mel_scale(LOW_HZ), kaldi_mel_scale(SAMPLE_RATE / 2.0)
    delta = (high - low) / (num_bins + 1)
    index = torch.arange(num_bins).unsqueeze(1)
    left = low + index * delta
    centre = low + (index + 1.0) * delta
    right = low + (index + 2.0) * delta
    mel = kaldi_mel_scale((SAMPLE_RATE / FFT_SIZE) * torch.arange(FFT_SIZE / 2)).unsqueeze(0)
    rising = (mel - left) / (centre - left)
    falling = (right - mel) / (right - centre)
    banks = torch.max(torch.zeros(1), torch.min(rising, falling))
    return torch.nn.functional.pad(banks, (0, 1))  # the Nyquist bin


class KaldiFbank:
    """Window and mel banks built once; `__call__` maps a 16 kHz clip to its features."""

    def __init__(self, num_mel_bins: int = 80) -> None:
        self.window = torch.hann_window(FRAME_LENGTH, periodic=False).pow(POVEY_POWER)
        self.banks = kaldi_mel_banks(num_mel_bins)

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """audio: [L] float32 at 16 kHz, L >= 400 -> [1 + (L - 400) // 160, num_mel_bins]."""
        if audio.ndim != 1 or audio.shape[0] < FRAME_LENGTH:
            raise ValueError(f"fbank needs a 1-D clip of at least {FRAME_LENGTH} samples, "
                             f"got {tuple(audio.shape)}")
        frames = audio.float().unfold(0, FRAME_LENGTH, FRAME_SHIFT)  # [m, 400]
        frames = frames - frames.mean(dim=1, keepdim=True)
        previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
        frames = (frames - PREEMPHASIS * previous) * self.window
        frames = torch.nn.functional.pad(frames, (0, FFT_SIZE - FRAME_LENGTH))
        power = torch.fft.rfft(frames).abs().pow(2.0)  # [m, 257]
        return torch.mm(power, self.banks.T).clamp(min=_EPSILON).log()
