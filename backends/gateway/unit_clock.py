"""When the audio of each 1-second unit was complete on the uplink, so that a unit's result can
say how long the server took for it (the demo protocol's cost fields) and how much audio the
session has sent (its `current_time`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.gateway.audio import INPUT_SAMPLE_RATE


@dataclass
class UnitClock:
    clock: object = field(default=time.monotonic)
    samples: int = 0
    _completed_at: dict[int, float] = field(default_factory=dict)
    _keep: int = 64  # units remembered: results come within seconds of their audio

    def sent(self, samples: int) -> None:
        before, self.samples = self.samples, self.samples + samples
        now = self.clock()
        for unit in range(before // INPUT_SAMPLE_RATE, self.samples // INPUT_SAMPLE_RATE):
            self._completed_at[unit] = now
            self._completed_at.pop(unit - self._keep, None)

    def since_unit_ms(self, unit: object) -> float:
        """Milliseconds since the unit's audio was complete (0.0 for an unknown unit)."""
        sent = self._completed_at.get(unit) if isinstance(unit, int) else None
        return 0.0 if sent is None else round(1000.0 * (self.clock() - sent), 1)

    @property
    def audio_ms(self) -> int:
        return self.samples * 1000 // INPUT_SAMPLE_RATE
