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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

LEAD_S = 0.5  # a stream's next window is due this long before its client runs dry


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
