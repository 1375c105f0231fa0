"""Streaming log-mel front end of MiniCPM-o's "exact" duplex mode: one session per instance.

What the checkpoint's streaming processor does (settings chunk_ms 1000, first_chunk_ms 1035,
cnn_redundancy_ms 20, sliding window 30 s trigger / 10 s stride), restated:
- Unit framing: the first unit is left-padded with zeros to 1035 ms (16560 samples); the
  processor takes the hop-aligned first chunk (16480 samples, 1030 ms), then 16000 samples per
  unit, so 80 samples always carry over to the next unit and never form one of their own.
- The processor buffers all it got (the sliding window drops the oldest 10 s, hop-aligned,
  whenever the buffer reaches 30 s) and emits only stable frames, whose STFT window lies in the
  buffer: chunk k holds the core frames [100k, 100k + 100) plus 2 redundancy frames on each
  side, clamped at frame 0, so 102 frames on the first chunk and 104 afterwards.
- Normalisation is that of the whole buffer at emission time: a fixed log10 floor of -10 while
  the buffer is shorter than 5 s, afterwards Whisper's (peak - 8) over every frame of the
  buffer (its unstable last frame included, and the frames at its left edge reflect-padded).
Instead of re-extracting the whole buffer per unit, each raw frame is computed once, when it
becomes stable, and cached for the window; only the unstable last frame and, after a slide,
the new left-edge frames are recomputed. tests/audio/test_streaming_mel.py checks the result
against whole-buffer re-extraction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.models.whisper_mel import (
    DYNAMIC_RANGE,
    HOP_LENGTH,
    N_FFT,
    NUM_MEL_BINS,
    SAMPLE_RATE,
    WhisperMel,
    normalize_log_mel,
    num_frames,
)

# Frames whose window starts left of sample 0 of the buffer: they carry reflect padding.
_LEFT_EDGE_FRAMES = -(-(N_FFT // 2) // HOP_LENGTH)


def _samples(ms: float) -> int:
    return int(round(ms * SAMPLE_RATE / 1000))


def _stable_frames(num_samples: int) -> int:
    """Frames of a buffer whose window ends inside it (no right reflection)."""
    if num_samples < N_FFT // 2:
        return 0
    return min(num_frames(num_samples), (num_samples - N_FFT // 2) // HOP_LENGTH + 1)


@dataclass(frozen=True, slots=True)
class StreamingMelConfig:
    chunk_ms: int = 1000
    first_chunk_ms: int = 1035  # the first unit is left-padded with zeros up to this length
    cnn_redundancy_ms: int = 20  # mel context on each side of a chunk for the conv stack
    slide_trigger_seconds: float = 30.0
    slide_stride_seconds: float = 10.0
    min_keep_seconds: float = 1.0  # a slide always leaves at least this much audio
    short_buffer_seconds: float = 5.0  # below this buffer length the floor is fixed
    short_buffer_log_floor: float = -10.0  # log10 floor for short buffers (the processor's)

    def __post_init__(self) -> None:
        if self.chunk_ms <= 0 or _samples(self.chunk_ms) % HOP_LENGTH:
            raise ValueError(f"chunk_ms must be a positive multiple of 10 ms, got {self.chunk_ms}")
        if self.first_chunk_ms < self.chunk_ms:
            raise ValueError(
                f"first_chunk_ms ({self.first_chunk_ms}) must be >= chunk_ms ({self.chunk_ms})"
            )
        if self.cnn_redundancy_ms < 0:
            raise ValueError(f"cnn_redundancy_ms must be >= 0, got {self.cnn_redundancy_ms}")
        # Every chunk must be emittable as soon as its unit arrives (exactly one chunk per unit).
        needed = self.chunk_frames + self.redundancy_frames
        if _stable_frames(self.first_chunk_samples) < needed:
            raise ValueError(
                f"first_chunk_ms {self.first_chunk_ms} leaves fewer than {needed} stable frames "
                f"(chunk frames + cnn_redundancy_ms {self.cnn_redundancy_ms} of right context)"
            )
        if not 0 < self.slide_stride_seconds < self.slide_trigger_seconds:
            raise ValueError(
                f"need 0 < slide_stride_seconds ({self.slide_stride_seconds}) < "
                f"slide_trigger_seconds ({self.slide_trigger_seconds})"
            )
        # A slide must keep the frames of the chunk being emitted, left redundancy included.
        if self.trigger_samples - self.stride_samples < 2 * self.chunk_samples:
            raise ValueError(
                f"slide_trigger_seconds - slide_stride_seconds must be >= 2 chunks, got "
                f"{self.slide_trigger_seconds} - {self.slide_stride_seconds}"
            )

    @property
    def chunk_samples(self) -> int:
        return _samples(self.chunk_ms)

    @property
    def chunk_frames(self) -> int:
        return self.chunk_samples // HOP_LENGTH

    @property
    def padded_first_samples(self) -> int:
        return _samples(self.first_chunk_ms)

    @property
    def first_chunk_samples(self) -> int:
        """The processor's hop-aligned first chunk (16480 samples for 1035 ms)."""
        return max(HOP_LENGTH, self.padded_first_samples // HOP_LENGTH * HOP_LENGTH)

    @property
    def redundancy_frames(self) -> int:
        return _samples(self.cnn_redundancy_ms) // HOP_LENGTH

    @property
    def trigger_samples(self) -> int:
        return int(self.slide_trigger_seconds * SAMPLE_RATE)

    @property
    def stride_samples(self) -> int:
        return int(self.slide_stride_seconds * SAMPLE_RATE)


class StreamingMel:
    """One session's streaming mel state: `push_unit` turns each unit into one chunk of frames."""

    def __init__(self, config: StreamingMelConfig, mel: WhisperMel) -> None:
        self.config = config
        self._mel = mel
        self.reset()

    def reset(self) -> None:
        self._pending = torch.zeros(0)  # [n] float32, received but not yet given to the window
        self._buffer = torch.zeros(0)  # [buffer_len] float32, the processor's window
        # [80, cached] float32, raw log-mel of the window's stable frames
        self._raw = torch.zeros(NUM_MEL_BINS, 0)
        self._base_frame = 0  # global index of the window's first frame
        self._emitted_frames = 0  # global end of the last emitted core
        self.num_chunks = 0

    @property
    def prefix_extra_frames(self) -> int:
        """Left redundancy frames of the next chunk (none before the stream start)."""
        return min(self._emitted_frames, self.config.redundancy_frames)

    def push_unit(self, unit: torch.Tensor) -> torch.Tensor:
        """Take one unit ([chunk_samples] float32) and return its chunk of mel frames:
        [80, prefix + chunk_frames + redundancy] float32 (102, then 104 with the defaults)."""
        if unit.ndim != 1 or unit.shape[0] != self.config.chunk_samples:
            raise ValueError(
                f"a unit is {self.config.chunk_samples} samples, got shape {tuple(unit.shape)}"
            )
        self._append(self._take_chunk(unit.to(torch.float32)))
        return self._emit(self._floor())

    def _take_chunk(self, unit: torch.Tensor) -> torch.Tensor:
        config = self.config
        pending = torch.cat([self._pending, unit])
        if self.num_chunks == 0:
            pad = max(config.padded_first_samples - pending.shape[0], 0)
            pending = torch.cat([pending.new_zeros(pad), pending])
        need = config.first_chunk_samples if self.num_chunks == 0 else config.chunk_samples
        self._pending = pending[need:].clone()
        return pending[:need]

    def _append(self, samples: torch.Tensor) -> None:
        self._buffer = torch.cat([self._buffer, samples])
        self._slide()
        cached, stable = self._raw.shape[1], _stable_frames(self._buffer.shape[0])
        if stable > cached:
            fresh = self._mel.raw_frames(self._buffer, cached, stable)
            self._raw = torch.cat([self._raw, fresh], dim=1)

    def _slide(self) -> None:
        config = self.config
        length = self._buffer.shape[0]
        if length < config.trigger_samples:
            return
        guard = min(_samples(config.min_keep_seconds * 1000), length - config.stride_samples)
        drop = min(config.stride_samples, max(0, length - guard)) // HOP_LENGTH * HOP_LENGTH
        if drop <= 0:
            return
        frames = drop // HOP_LENGTH
        self._buffer = self._buffer[drop:].clone()
        self._base_frame += frames
        self._raw = self._raw[:, frames:].clone()
        edge = min(_LEFT_EDGE_FRAMES, self._raw.shape[1])
        self._raw[:, :edge] = self._mel.raw_frames(self._buffer, 0, edge)

    def _floor(self) -> float:
        length = self._buffer.shape[0]
        if length < self.config.short_buffer_seconds * SAMPLE_RATE:
            return self.config.short_buffer_log_floor
        tail = self._mel.raw_frames(self._buffer, self._raw.shape[1], num_frames(length))
        peak = float(self._raw.max())
        if tail.numel():
            peak = max(peak, float(tail.max()))
        return peak - DYNAMIC_RANGE

    def _emit(self, floor: float) -> torch.Tensor:
        redundancy = self.config.redundancy_frames
        core_end = self._emitted_frames + self.config.chunk_frames
        start = self._emitted_frames - self.prefix_extra_frames - self._base_frame
        stop = core_end + redundancy - self._base_frame
        # Guaranteed by the config checks; a failure here is a bug in this module.
        assert 0 <= start and stop <= self._raw.shape[1], (start, stop, self._raw.shape)
        self._emitted_frames = core_end
        self.num_chunks += 1
        return normalize_log_mel(self._raw[:, start:stop], floor)
