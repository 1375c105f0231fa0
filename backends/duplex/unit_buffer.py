"""Cuts the uplink PCM stream into exact 1-second units (16000 samples at 16 kHz)."""
from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
UNIT_SAMPLES = SAMPLE_RATE  # one unit = 1 s


class UnitBuffer:
    def __init__(self) -> None:
        self._pending = np.zeros((0,), dtype=np.float32)  # [< UNIT_SAMPLES] float32

    @property
    def num_pending(self) -> int:
        return int(self._pending.size)

    def push(self, pcm16: np.ndarray) -> list[np.ndarray]:
        """Add int16 samples; return the whole units now complete ([16000] float32 each)."""
        samples = pcm16.astype(np.float32) / 32768.0
        self._pending = np.concatenate([self._pending, samples])
        num_units = self._pending.size // UNIT_SAMPLES
        units = [self._pending[i * UNIT_SAMPLES:(i + 1) * UNIT_SAMPLES] for i in range(num_units)]
        self._pending = self._pending[num_units * UNIT_SAMPLES:].copy()
        return units

    def flush_padded(self) -> np.ndarray | None:
        """On commit: the residual audio zero-padded to a whole unit, or None if empty."""
        if self._pending.size == 0:
            return None
        unit = np.zeros((UNIT_SAMPLES,), dtype=np.float32)
        unit[: self._pending.size] = self._pending
        self._pending = np.zeros((0,), dtype=np.float32)
        return unit
