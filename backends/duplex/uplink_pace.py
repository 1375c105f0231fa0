"""How far ahead of real time one session's uplink audio may run.

A client streams audio in real time; one that sends faster only queues audio ahead of the
model, which costs memory and delays every later unit of the session. So an append is refused
(`resource_exhausted`) when, with it, the session would be more than `max_ahead_s`

- ahead of real time: a leaky bucket filled by each append and drained at one second of audio
  per wall second since the session's first append; it never drains below empty, so a pause
  earns no credit for a later burst; and
- ahead of the model: audio accepted but not yet taken by the Thinker (queued units and the
  partial unit).

Either one within the bound is enough: a real-time client is never refused, even when the model
falls behind, and a client may run as fast as the model takes its audio. A burst of up to
`max_ahead_s` is always accepted (a client that sends a few seconds at once), and what a session
holds stays bounded by `max_ahead_s` plus the model's own lag behind real time.
"""
from __future__ import annotations

from typing import Callable

from backends.duplex.errors import INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DuplexError
from backends.duplex.unit_buffer import SAMPLE_RATE


class UplinkPace:
    """One session's bucket; its owner serialises the calls (the session lock)."""

    def __init__(self, max_ahead_s: float, clock: Callable[[], float]) -> None:
        self.max_ahead_samples = int(max_ahead_s * SAMPLE_RATE)
        self._clock = clock
        self._level = 0.0  # samples ahead of real time
        self._last: float | None = None  # clock() of the last append

    def admit(self, samples: int, waiting: int) -> None:
        """Account for an append of `samples`, or raise DuplexError and change nothing.
        `waiting`: samples the session holds that the Thinker has not taken yet."""
        if samples == 0:
            return
        now = self._clock()
        level = self._drained(now)
        limit = self.max_ahead_samples
        if samples > limit:
            raise DuplexError(INVALID_ARGUMENT, f"an append of {samples / SAMPLE_RATE:.1f} s is longer than the "
                                                f"uplink bound of {limit / SAMPLE_RATE:g} s; send shorter appends")
        if level + samples > limit and waiting + samples > limit:
            raise DuplexError(RESOURCE_EXHAUSTED, (
                f"append refused: the uplink would run {(level + samples) / SAMPLE_RATE:.1f} s ahead of real time "
                f"with {(waiting + samples) / SAMPLE_RATE:.1f} s waiting for the model, over the bound of "
                f"{limit / SAMPLE_RATE:g} s; send audio no faster than real time"))
        self._level, self._last = level + samples, now

    def _drained(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return max(0.0, self._level - (now - self._last) * SAMPLE_RATE)
