"""A session's uplink audio until the Thinker takes it: the partial unit (UnitBuffer), the
queued units (UnitQueue) and the bound on both (UplinkPace)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from backends.duplex.unit_buffer import UnitBuffer
from backends.duplex.unit_queue import SessionConfig, UnitQueue
from backends.duplex.uplink_pace import UplinkPace


class UplinkIntake:
    """Called under the session lock, except `units`, which the Thinker loop reads."""

    def __init__(self, config: SessionConfig, clock: Callable[[], float]) -> None:
        self.units = UnitQueue(config.max_units_per_append)
        self._buffer = UnitBuffer()
        self._pace = UplinkPace(config.max_uplink_ahead_s, clock)

    @property
    def held_samples(self) -> int:
        """Audio accepted and not yet taken by the Thinker (queued units and the partial one)."""
        return self.units.waiting_samples + self._buffer.num_pending

    def cut(self, pcm16: np.ndarray, commit: bool) -> list[np.ndarray]:
        """The whole units the append completes ([16000] float32 each), the partial one padded
        on `commit`; raises DuplexError, taking nothing, past the bound."""
        self._pace.admit(pcm16.size, self.held_samples)
        units = self._buffer.push(pcm16)
        if commit and (residual := self._buffer.flush_padded()) is not None:
            units.append(residual)
        return units

    def drop(self) -> None:
        """Free all audio held (a close); the caller then puts the queue's sentinel."""
        self._buffer = UnitBuffer()
        self.units.clear()
