"""Uplink audio preparation: downmix to mono and resample to 16 kHz with an anti-alias filter.

The server accepts 16 kHz only (resampling is the client's job), so the client converts any
input instead of rejecting it. soxr's high-quality resampler low-passes below the new Nyquist
frequency first, so content above 8 kHz of a 44.1/48 kHz recording is removed rather than folded
back into the speech band.
"""

from __future__ import annotations

import numpy as np
import soxr

from client.wav import WavAudio

UPLINK_SAMPLE_RATE = 16000
QUALITY = "HQ"  # soxr's high quality: a steep filter, far below one 200 ms append of delay


def downmix_to_mono(samples: np.ndarray) -> np.ndarray:
    """[num_frames, num_channels] int16 -> [num_frames] int16, the rounded channel mean."""
    if samples.ndim != 2:
        raise ValueError(f"expected [num_frames, num_channels], got shape {samples.shape}")
    if samples.shape[1] == 1:
        return samples[:, 0].copy()
    return np.rint(samples.astype(np.float64).mean(axis=1)).astype(np.int16)


def resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """[n] int16 at src_rate -> [about n * dst / src] int16 at dst_rate, anti-aliased."""
    if samples.ndim != 1:
        raise ValueError(f"expected mono [n] samples, got shape {samples.shape}")
    if src_rate <= 0 or dst_rate <= 0:
        raise ValueError(f"sample rates must be > 0, got {src_rate} -> {dst_rate}")
    if src_rate == dst_rate:
        return samples.astype(np.int16, copy=True)
    if samples.shape[0] == 0:
        return np.zeros(0, dtype=np.int16)
    values = soxr.resample(samples.astype(np.float32), src_rate, dst_rate, quality=QUALITY)
    return np.clip(np.rint(values), -32768, 32767).astype(np.int16)


def to_uplink_pcm(audio: WavAudio) -> np.ndarray:
    """Any audio -> [n] int16 mono at 16 kHz, as the `AUDIO` input expects."""
    return resample(downmix_to_mono(audio.samples), audio.sample_rate, UPLINK_SAMPLE_RATE)
