"""Uplink audio preparation: downmix to mono and resample to 16 kHz by linear interpolation.

The server accepts 16 kHz only (resampling is the client's job), so the client converts any
PCM16 input instead of rejecting it. Linear interpolation has no anti-alias filter: downsampling
from 44.1/48 kHz folds energy above 8 kHz back into the band. That is harmless for a speech
demo; feed 16 kHz recordings when the exact input matters.
"""

from __future__ import annotations

import numpy as np

from client.wav import WavAudio

UPLINK_SAMPLE_RATE = 16000


def downmix_to_mono(samples: np.ndarray) -> np.ndarray:
    """[num_frames, num_channels] int16 -> [num_frames] int16, the rounded channel mean."""
    if samples.ndim != 2:
        raise ValueError(f"expected [num_frames, num_channels], got shape {samples.shape}")
    if samples.shape[1] == 1:
        return samples[:, 0].copy()
    return np.rint(samples.astype(np.float64).mean(axis=1)).astype(np.int16)


def resample_linear(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """[n] int16 at src_rate -> [floor(n * dst / src)] int16 at dst_rate.

    Output sample j sits at input position j * src / dst; past the last input sample the last
    value is held.
    """
    if samples.ndim != 1:
        raise ValueError(f"expected mono [n] samples, got shape {samples.shape}")
    if src_rate <= 0 or dst_rate <= 0:
        raise ValueError(f"sample rates must be > 0, got {src_rate} -> {dst_rate}")
    if src_rate == dst_rate:
        return samples.astype(np.int16, copy=True)
    num_out = samples.shape[0] * dst_rate // src_rate
    if num_out == 0:
        return np.zeros(0, dtype=np.int16)
    positions = np.arange(num_out, dtype=np.float64) * (src_rate / dst_rate)
    values = np.interp(positions, np.arange(samples.shape[0]), samples.astype(np.float64))
    return np.clip(np.rint(values), -32768, 32767).astype(np.int16)


def to_uplink_pcm(audio: WavAudio) -> np.ndarray:
    """Any PCM16 wav -> [n] int16 mono at 16 kHz, as the `AUDIO` input expects."""
    return resample_linear(downmix_to_mono(audio.samples), audio.sample_rate, UPLINK_SAMPLE_RATE)
