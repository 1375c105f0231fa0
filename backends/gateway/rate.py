"""The input rate bound of one connection: audio may run at most `slack_s` ahead of real time,
counted from the connection's first audio (a pause restarts the count). Kept below the server's
own bound (max_uplink_ahead_s, 5 s by default) so the gateway refuses first, with its own code."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.gateway.audio import INPUT_SAMPLE_RATE


@dataclass
class InputRate:
    slack_s: float
    clock: object = field(default=time.monotonic)
    _start: float | None = None
    _samples: int = 0

    def admit(self, samples: int) -> bool:
        """Count `samples` if they keep the connection within the bound; False: refused."""
        now = self.clock()
        if self._start is None:
            self._start = now
        allowed = (now - self._start + self.slack_s) * INPUT_SAMPLE_RATE
        if self._samples + samples > allowed:
            return False
        self._samples += samples
        return True

    def restart(self) -> None:
        self._start, self._samples = None, 0
