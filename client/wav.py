"""Audio files through soundfile (libsndfile): any common format in, PCM16 out.

Reading takes whatever libsndfile reads (wav of any sample format: 16/24/32-bit integer, float;
FLAC, OGG/Vorbis, AIFF, ...) and quantizes it once to int16, the only sample format the duplex
model speaks. Writing picks the container from the file name (`.wav`, `.flac`, ...), PCM16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

INT16_SCALE = 32768.0  # libsndfile's float <-> 16-bit scale: PCM16 in, PCM16 out, exactly


@dataclass(frozen=True, slots=True)
class WavAudio:
    samples: np.ndarray  # [num_frames, num_channels] int16
    sample_rate: int  # Hz

    def __post_init__(self) -> None:
        if self.samples.dtype != np.int16 or self.samples.ndim != 2:
            raise ValueError(
                f"samples must be [num_frames, num_channels] int16, got {self.samples.dtype}"
                f" {self.samples.shape}"
            )
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0, got {self.sample_rate}")

    @property
    def num_channels(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / self.sample_rate


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1) -> int16, rounded; out-of-range values clip instead of wrapping."""
    return np.clip(np.rint(samples * INT16_SCALE), -32768, 32767).astype(np.int16)


def read_wav(path: str | Path) -> WavAudio:
    """Read any audio file libsndfile supports as [frames, channels] int16; ValueError says why not."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"No such file: {path}")
    try:
        samples, rate = soundfile.read(str(path), dtype="float64", always_2d=True)  # [n, channels]
    except soundfile.LibsndfileError as exc:
        raise ValueError(f"{path}: not an audio file libsndfile can read ({exc})") from exc
    return WavAudio(to_int16(samples), int(rate))


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write `samples`, [n] (mono) or [n, num_channels] int16, as PCM16; the container follows
    the file name's extension (`.wav` when it names none libsndfile knows)."""
    if samples.dtype != np.int16 or samples.ndim not in (1, 2):
        raise ValueError(
            f"samples must be [n] or [n, channels] int16, got {samples.dtype} {samples.shape}"
        )
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
    frames = samples[:, None] if samples.ndim == 1 else samples  # [n, num_channels]
    known = Path(path).suffix.lstrip(".").upper() in soundfile.available_formats()
    soundfile.write(str(path), frames, sample_rate, subtype="PCM_16", format=None if known else "WAV")
