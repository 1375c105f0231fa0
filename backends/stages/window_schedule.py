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

The `max_batch` smallest slacks are decoded (ties: the longer-pending stream first), so no stream
starves: a stream with audio queued grows more urgent as its audio plays out.
"""

from __future__ import annotations

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


def pick(candidates: list[Candidate], now: float, max_batch: int) -> list[str]:
    """The request ids to decode now: up to `max_batch`, least slack first."""
    order = sorted(candidates, key=lambda c: (c.slack(now), c.waiting_since))
    return [c.request_id for c in order[:max_batch]]
