"""PCM16 wav files through the stdlib `wave` module (no audio library needed)."""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SAMPLE_WIDTH = 2  # bytes: 16-bit PCM is the only format the duplex model speaks


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


def read_wav(path: str | Path) -> WavAudio:
    """Read a 16-bit PCM wav file; other sample formats raise ValueError."""
    try:
        with wave.open(str(path), "rb") as reader:
            width, channels = reader.getsampwidth(), reader.getnchannels()
            rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
    except wave.Error as exc:
        # The stdlib reader rejects float and compressed wavs with terse messages.
        raise ValueError(
            f"{path}: not a PCM16 wav file ({exc}); convert it with"
            " `sox in.wav -b 16 -e signed-integer out.wav`"
        ) from exc
    if width != _SAMPLE_WIDTH:
        raise ValueError(f"{path}: {8 * width}-bit samples; only 16-bit PCM is supported")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.int16).reshape(-1, channels)
    return WavAudio(samples, rate)


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write `samples`, [n] (mono) or [n, num_channels] int16, as a PCM16 wav file."""
    if samples.dtype != np.int16 or samples.ndim not in (1, 2):
        raise ValueError(
            f"samples must be [n] or [n, channels] int16, got {samples.dtype} {samples.shape}"
        )
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
    frames = samples[:, None] if samples.ndim == 1 else samples  # [n, num_channels]
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(frames.shape[1])
        writer.setsampwidth(_SAMPLE_WIDTH)
        writer.setframerate(sample_rate)
        writer.writeframes(np.ascontiguousarray(frames, dtype="<i2").tobytes())
