"""Which streams' windows Code2Wav decodes next: least playback slack first.

A forward takes at most `max_batch` windows, so under load some streams wait. Round robin made
a new reply's first window (the user hears nothing until it is done) wait behind windows of
streams that still had seconds of audio queued at the client, e.g. the four windows a turn end
hands over at once. Here every stream with a pending window gets a slack: how long its client
can still play before running dry, counted from now:

- a stream whose client has audio left plays until `audio_end` (the audio sent so far, laid
  end to end from when each piece was sent: `PlayoutClock`); its next window is due
  `LEAD_S` before that, time for a forward, the trip to the client and jitter;
- a stream that has nothing left to play has been waiting since its oldest pending window
  arrived (for a reply's first window: since the reply could have started), so its slack is
  negative and the longer it waits the more urgent it gets.

Streams with no slack left (due: a reply's first window, a client about to run dry) are
decoded first, up to `max_batch`, and only they, apart from streams that ride along for free in
the graph bucket the due ones fill anyway (`fill_to`): a forward's time grows with its batch
(one window ~15 ms, eight ~22 ms on an H200), and a window with audio queued at its client can
wait one more forward. With nothing due the `max_batch` smallest slacks go (ties: the longer-
pending stream first). No stream starves: a stream with audio queued grows due as it plays out.

A reply's first window can also be announced before it exists (`FirstWindowHints`: the
orchestrator sends `expect` as the reply's Talker starts, ~20-30 ms ahead). Until it arrives,
windows that are not due wait (`held_for`): a forward takes ~12-17 ms on an H200 and cannot be
interrupted, so one started just before the first window arrives costs that reply its wait,
while a held window's client still has more than `LEAD_S` of audio to play.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

LEAD_S = 0.5  # a stream's next window is due this long before its client runs dry
# How long an announced first window holds the others at most: the Talker's first 25 frames
# take ~20 ms (C = 1) to ~30 ms (C = 16) on an H200; a window that never comes frees them then.
FIRST_WINDOW_HOLD_S = 0.05
MAX_HINTS = 1024  # announced first windows tracked at once (more are ignored, never an error)


@dataclass(slots=True)
class PlayoutClock:
    """A client's playback of one stream, as the server sees it (wall-clock seconds)."""

    audio_end: float = float("-inf")  # when the audio sent so far has finished playing

    def sent(self, now: float, seconds: float) -> None:
        """`seconds` of audio sent at `now`: it plays after what is queued, or at once."""
        self.audio_end = max(self.audio_end, now) + seconds


@dataclass(frozen=True, slots=True)
class Candidate:
    request_id: str
    waiting_since: float  # arrival of its oldest pending window
    audio_end: float  # its PlayoutClock's (-inf: nothing sent yet)

    def slack(self, now: float) -> float:
        return max(self.audio_end - LEAD_S, self.waiting_since) - now


def pick(candidates: list[Candidate], now: float, max_batch: int,
         fill_to: Callable[[int], int] = lambda rows: rows) -> list[str]:
    """The request ids to decode now, least slack first: the due ones (up to `max_batch`) and
    as many others as `fill_to(number due)` has room for; with none due, up to `max_batch`."""
    order = sorted(candidates, key=lambda c: (c.slack(now), c.waiting_since))
    num_due = sum(c.slack(now) <= 0.0 for c in order[:max_batch])
    size = max_batch if num_due == 0 else min(max_batch, max(num_due, fill_to(num_due)))
    return [c.request_id for c in order[:size]]


def held_for(candidates: list[Candidate], now: float, hold_s: float) -> float:
    """How long the pending windows may still wait for an announced first window (0: decode
    now): never past the hold, nor past the moment the first of them falls due."""
    if hold_s <= 0.0 or not candidates:
        return 0.0
    return max(0.0, min(hold_s, min(c.slack(now) for c in candidates)))


@dataclass(slots=True)
class FirstWindowHints:
    """Replies whose first window is on its way: request id -> when its hold ends."""

    hold_s: float = FIRST_WINDOW_HOLD_S  # 0: announcements are ignored
    _until: dict[str, float] = field(default_factory=dict)

    def announce(self, request_id: str, now: float) -> None:
        self._prune(now)
        if self.hold_s > 0.0 and (len(self._until) < MAX_HINTS or request_id in self._until):
            self._until[request_id] = now + self.hold_s

    def arrived(self, request_id: str) -> None:
        """Its first window came (or the request ended): it holds nothing any more."""
        self._until.pop(request_id, None)

    def remaining(self, now: float) -> float:
        """Seconds until the last live announcement expires (0: none is live)."""
        self._prune(now)
        return max(self._until.values(), default=now) - now

    def __len__(self) -> int:
        return len(self._until)

    def _prune(self, now: float) -> None:
        for request_id in [r for r, until in self._until.items() if until <= now]:
            del self._until[request_id]
