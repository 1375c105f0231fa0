"""Reading and writing PCM wav files (the checkpoint's reference voice) with the stdlib.

Samples are float32 in [-1, 1] on the Python side and integer PCM on disk. Only integer PCM
is supported because the stdlib `wave` module reads nothing else; a float wav is refused
with a message saying so.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

_PCM16_SCALE = 32767.0  # symmetric, so +1.0 and -1.0 both map to valid int16 values
_DTYPES = {1: np.uint8, 2: np.int16, 4: np.int32}


def write_wav_pcm16(path: Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono `samples` ([num_samples] float, clipped to [-1, 1]) as 16-bit PCM."""
    if samples.ndim != 1:
        raise ValueError(f"expected mono samples [num_samples], got shape {samples.shape}")
    pcm = np.round(np.clip(samples, -1.0, 1.0) * _PCM16_SCALE).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Return (samples [num_samples] float32 in [-1, 1], sample_rate); channels are averaged."""
    try:
        with wave.open(str(path), "rb") as src:
            channels, width, rate = src.getnchannels(), src.getsampwidth(), src.getframerate()
            frames = src.readframes(src.getnframes())
    except wave.Error as err:
        raise ValueError(f"{path}: not an integer-PCM wav file ({err})") from err
    samples = _pcm_to_float(frames, width)
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32), rate


def _pcm_to_float(frames: bytes, width: int) -> np.ndarray:
    if width == 3:
        # 24-bit has no numpy dtype: widen each little-endian triple into the top of an int32.
        raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = (raw[:, 0] << 8) | (raw[:, 1] << 16) | (raw[:, 2] << 24)
        return value.astype(np.float64) / 2.0**31
    if width not in _DTYPES:
        raise ValueError(f"unsupported wav sample width: {width} bytes")
    value = np.frombuffer(frames, dtype=np.dtype(_DTYPES[width]).newbyteorder("<"))
    if width == 1:
        return (value.astype(np.float64) - 128.0) / 128.0
    return value.astype(np.float64) / float(2 ** (8 * width - 1))
