"""Band-limited resampling by a rational factor (windowed-sinc interpolation).

For a ratio new/old reduced to coprime (up, down): every output phase k of `up` reads the input
through its own sinc kernel, low-passed at min(up, down) x 0.99 of the lower Nyquist and
shaped by a squared-cosine (Hann) window six zero crossings wide, the method and defaults of
torchaudio's `Resample` (which the reference uses for the prompt). Only the voice prompt is
resampled, once per voice, so clarity matters more than speed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_ZERO_CROSSINGS = 6
_ROLLOFF = 0.99


def resample(audio: torch.Tensor, old_rate: int, new_rate: int) -> torch.Tensor:
    """audio: [L] float32 -> [ceil(L new / old)] float32."""
    if old_rate <= 0 or new_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {old_rate} -> {new_rate}")
    if old_rate == new_rate:
        return audio.clone()
    common = math.gcd(old_rate, new_rate)
    down, up = old_rate // common, new_rate // common
    kernels, width = _kernels(down, up, audio.dtype)
    padded = F.pad(audio[None, None], (width, width + down))
    phases = F.conv1d(padded, kernels[:, None], stride=down)  # [1, up, frames]
    out = phases[0].T.reshape(-1)  # interleave the phases
    return out[: math.ceil(audio.shape[0] * up / down)]


def _kernels(down: int, up: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """-> ([up, 2 width + down] kernels, width in input samples)."""
    cutoff = min(down, up) * _ROLLOFF
    width = math.ceil(_ZERO_CROSSINGS * down / cutoff)
    taps = torch.arange(-width, width + down, dtype=torch.float64)[None, :] / down
    phases = torch.arange(0, -up, -1, dtype=torch.float64)[:, None] / up
    t = ((taps + phases) * cutoff).clamp(-_ZERO_CROSSINGS, _ZERO_CROSSINGS)
    window = torch.cos(t * math.pi / _ZERO_CROSSINGS / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    return (sinc * window * (cutoff / down)).to(dtype), width
