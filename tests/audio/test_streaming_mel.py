"""Streaming mel front end against a whole-buffer re-extraction model of the checkpoint processor.

Strategy: `_ReferenceProcessor` restates the reference processor the slow, obvious way (keep
the buffer, slide it, re-extract every frame of it per unit with the floor rule, cut the
chunk by global frame index), while `StreamingMel` caches frames incrementally. They must
agree on every chunk over 45 units, which crosses the 5 s floor switch and two window slides
(units 29 and 39). The signal has silent gaps, where the floor decides the value, and a loud
burst right at the first slide's new window start, where only the reflect-padded left-edge
frames see it as the window peak.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.audio.streaming_mel import StreamingMel, StreamingMelConfig
from backends.models.whisper_mel import HOP_LENGTH, WhisperMel, normalize_log_mel

# Cached frames and re-extracted frames are the same float32 STFT arithmetic on differently
# laid out segments: only rounding separates them.
FEATURE_TOLERANCE = 2e-5
UNIT = 16000
FIRST_PAD = 560  # zeros in front of the first unit (1035 ms - 1000 ms)
FIRST_CHUNK = 16480  # the processor's hop-aligned first chunk
SLIDE_START = 160000  # buffer start (in padded-signal samples) after the first slide


class _ReferenceProcessor:
    """The checkpoint processor restated: whole-buffer extraction per call."""

    def __init__(self, mel: WhisperMel) -> None:
        self.mel, self.signal = mel, np.zeros(FIRST_PAD, np.float32)
        self.buffer_start = self.received = self.calls = 0

    def push(self, unit: np.ndarray) -> torch.Tensor:
        self.signal = np.concatenate([self.signal, unit])
        self.received = FIRST_CHUNK + UNIT * self.calls  # samples of `signal` handed over
        if self.received - self.buffer_start >= 30 * UNIT:
            self.buffer_start += 10 * UNIT
        buffer = torch.from_numpy(self.signal[self.buffer_start:self.received].copy())
        raw = self.mel.raw_frames(buffer, 0, buffer.shape[0] // HOP_LENGTH)
        floor = -10.0 if buffer.shape[0] < 5 * UNIT else float(raw.max()) - 8.0
        base = self.buffer_start // HOP_LENGTH
        start, stop = max(0, 100 * self.calls - 2), 100 * self.calls + 102
        self.calls += 1
        return normalize_log_mel(raw[:, start - base:stop - base], floor)


def _signal(num_units: int) -> np.ndarray:
    """Noise with silent gaps and two loud bursts: one at padded-signal sample SLIDE_START,
    one in the last 100 samples given to the processor with unit 6, which only the unstable
    last frame of the buffer covers at that call."""
    rng = np.random.default_rng(0)
    audio = (0.05 * rng.standard_normal(num_units * UNIT)).astype(np.float32)
    for unit in range(0, num_units, 3):  # a silent 0.3 s in every third unit
        audio[unit * UNIT + 4000: unit * UNIT + 8800] = 0.0
    for start in (SLIDE_START - FIRST_PAD - 150, FIRST_CHUNK + 6 * UNIT - FIRST_PAD - 100):
        if audio.shape[0] >= start + 400:
            audio[start: start + 400] = 0.9 * np.sign(rng.standard_normal(400))
    return audio


@pytest.fixture(scope="module")
def mel() -> WhisperMel:
    return WhisperMel()


def test_chunks_match_whole_buffer_reextraction(mel: WhisperMel) -> None:
    audio = _signal(45)
    streaming, reference = StreamingMel(StreamingMelConfig(), mel), _ReferenceProcessor(mel)
    for index, unit in enumerate(np.split(audio, 45)):
        ours, expected = streaming.push_unit(torch.from_numpy(unit)), reference.push(unit)
        assert ours.shape == expected.shape == (80, 102 if index == 0 else 104), index
        torch.testing.assert_close(ours, expected, rtol=0, atol=FEATURE_TOLERANCE,
                                   msg=lambda m, i=index: f"unit {i}: {m}")


class _CountingMel(WhisperMel):
    def __init__(self) -> None:
        super().__init__()
        self.frames_computed = 0

    def raw_frames(self, samples: torch.Tensor, first: int, stop: int) -> torch.Tensor:
        self.frames_computed += stop - first
        return super().raw_frames(samples, first, stop)


def test_each_unit_computes_only_new_frames() -> None:
    """The cost bound of the incremental design (a unit must stay a few ms on CPU): per unit,
    the 100 newly stable frames, the unstable last frame and, after a slide, 2 edge frames;
    never the 30 s window again."""
    mel = _CountingMel()
    streaming = StreamingMel(StreamingMelConfig(), mel)
    per_unit = []
    for unit in np.split(_signal(41), 41):
        before = mel.frames_computed
        streaming.push_unit(torch.from_numpy(unit))
        per_unit.append(mel.frames_computed - before)
    assert per_unit[0] == 102 and set(per_unit[1:4]) == {100}  # short buffer: no peak needed
    assert max(per_unit[4:]) <= 103 and per_unit[29] == per_unit[39] == 103


def test_first_chunk_is_the_zero_padded_start(mel: WhisperMel) -> None:
    """The first unit gets 560 zeros in front and its last 80 samples wait for the next unit;
    the 102 frames use the fixed -10 floor of a short buffer."""
    unit = _signal(1)
    padded = torch.from_numpy(np.concatenate([np.zeros(FIRST_PAD, np.float32), unit])[:FIRST_CHUNK])
    expected = normalize_log_mel(mel.raw_frames(padded, 0, 102), -10.0)
    chunk = StreamingMel(StreamingMelConfig(), mel).push_unit(torch.from_numpy(unit))
    torch.testing.assert_close(chunk, expected, rtol=0, atol=FEATURE_TOLERANCE)


def test_prefix_extra_frames_and_reset(mel: WhisperMel) -> None:
    streaming = StreamingMel(StreamingMelConfig(), mel)
    units = [torch.from_numpy(u) for u in np.split(_signal(3), 3)]
    assert streaming.prefix_extra_frames == 0
    first = [streaming.push_unit(u) for u in units]
    assert streaming.prefix_extra_frames == 2 and streaming.num_chunks == 3
    streaming.reset()
    assert streaming.prefix_extra_frames == 0 and streaming.num_chunks == 0
    for before, unit in zip(first, units):
        assert torch.equal(streaming.push_unit(unit), before)


def test_rejects_partial_units(mel: WhisperMel) -> None:
    with pytest.raises(ValueError, match="16000"):
        StreamingMel(StreamingMelConfig(), mel).push_unit(torch.zeros(15999))


@pytest.mark.parametrize("kwargs,match", [
    ({"first_chunk_ms": 1000}, "stable frames"),
    ({"chunk_ms": 1005}, "multiple of 10"),
    ({"slide_stride_seconds": 30.0}, "slide_stride_seconds"),
    ({"slide_stride_seconds": 29.0}, "2 chunks"),
])
def test_config_rejects_unworkable_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamingMelConfig(**kwargs)
