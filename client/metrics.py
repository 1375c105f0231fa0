"""Per-turn latency metrics from client timelines, as defined in docs/metrics.md#latency-of-a-turn.

All times are client `time.monotonic()` seconds; results are in ms (RTF is a ratio).
- client TTFT / TTFP: first uplink append of the turn -> first text / first audio received.
- server TTFT / TTFP: the `ttft_ms` / `ttfp_ms` the server put on the first text / audio.
- RTF: (last audio chunk received - turn start) / audio duration received; < 1 keeps up.
- inter-chunk gaps: arrival time between consecutive audio chunks.
- playback stalls: a simulated player starts `buffer_ms` after the first chunk arrives and
  plays chunks back to back; a chunk arriving after the queued audio ran out stalls it for the
  difference, and playback resumes on arrival (no re-buffering). A stall longer than
  `underrun_gap_ms` is an underrun.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

OUTPUT_SAMPLE_RATE = 24000  # Hz of AUDIO_OUT
PLAYBACK_BUFFER_MS = 200.0  # the simulated client's initial buffer
UNDERRUN_GAP_MS = 100.0  # commonly cited audible gap (vLLM-Omni's continuity threshold)


@dataclass(frozen=True, slots=True)
class ChunkArrival:
    received_s: float
    num_samples: int  # AUDIO_OUT samples at OUTPUT_SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class TurnTimeline:
    """What the client saw of one response, as raw timestamps."""

    response_id: str
    turn_start_s: float  # first uplink append of the turn
    status: str | None  # response.done status; None if it never came
    first_text_s: float | None  # first event with non-empty text
    server_ttft_ms: float | None
    server_ttfp_ms: float | None
    chunks: tuple[ChunkArrival, ...]


@dataclass(frozen=True, slots=True)
class PlaybackStats:
    stalls_ms: tuple[float, ...]  # every time the simulated player ran dry, in order
    num_underruns: int  # stalls longer than the underrun threshold
    underrun_ms: float  # total duration of those stalls


@dataclass(frozen=True, slots=True)
class TurnMetrics:
    turn_index: int
    response_id: str
    status: str | None
    client_ttft_ms: float | None
    client_ttfp_ms: float | None
    server_ttft_ms: float | None
    server_ttfp_ms: float | None
    rtf: float | None  # None without audio
    audio_ms: float  # audio received for this response
    num_chunks: int
    inter_chunk_gaps_ms: tuple[float, ...]
    max_inter_chunk_gap_ms: float | None
    playback_stalls_ms: tuple[float, ...]
    num_underruns: int
    underrun_ms: float


@dataclass(frozen=True, slots=True)
class SessionReport:
    session_id: str | int
    turns: tuple[TurnMetrics, ...]
    errors: tuple[str, ...]  # one line per error event, failed request or client-side failure
    input_ms: float  # user audio streamed
    silence_ms: float  # silence streamed after it
    reply_audio_ms: float  # all audio received
    wall_s: float  # START sent -> session settled
    closed_cleanly: bool  # session.closed seen and the downlink FINAL received

    @property
    def mean_rtf(self) -> float | None:
        """The session's RTF: mean over its turns with audio."""
        values = [turn.rtf for turn in self.turns if turn.rtf is not None]
        return sum(values) / len(values) if values else None

    @property
    def ok(self) -> bool:
        return not self.errors and self.reply_audio_ms > 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "mean_rtf": self.mean_rtf, "ok": self.ok}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def simulate_playback(
    chunks: tuple[ChunkArrival, ...],
    *,
    sample_rate: int = OUTPUT_SAMPLE_RATE,
    buffer_ms: float = PLAYBACK_BUFFER_MS,
    underrun_gap_ms: float = UNDERRUN_GAP_MS,
) -> PlaybackStats:
    stalls_ms: list[float] = []
    play_until_s = 0.0  # when the queued audio runs out
    for index, chunk in enumerate(chunks):
        duration_s = chunk.num_samples / sample_rate
        if index == 0:
            play_until_s = chunk.received_s + buffer_ms / 1000.0 + duration_s
        elif chunk.received_s > play_until_s:
            stalls_ms.append((chunk.received_s - play_until_s) * 1000.0)
            play_until_s = chunk.received_s + duration_s
        else:
            play_until_s += duration_s
    underruns = [stall for stall in stalls_ms if stall > underrun_gap_ms]
    return PlaybackStats(tuple(stalls_ms), len(underruns), sum(underruns))


def compute_turn_metrics(
    timeline: TurnTimeline, turn_index: int, *, sample_rate: int = OUTPUT_SAMPLE_RATE
) -> TurnMetrics:
    chunks = timeline.chunks
    start_s = timeline.turn_start_s
    audio_s = sum(chunk.num_samples for chunk in chunks) / sample_rate
    gaps_ms = tuple(
        (later.received_s - earlier.received_s) * 1000.0
        for earlier, later in zip(chunks, chunks[1:])
    )
    playback = simulate_playback(chunks, sample_rate=sample_rate)
    return TurnMetrics(
        turn_index=turn_index,
        response_id=timeline.response_id,
        status=timeline.status,
        client_ttft_ms=_elapsed_ms(start_s, timeline.first_text_s),
        client_ttfp_ms=_elapsed_ms(start_s, chunks[0].received_s if chunks else None),
        server_ttft_ms=timeline.server_ttft_ms,
        server_ttfp_ms=timeline.server_ttfp_ms,
        rtf=(chunks[-1].received_s - start_s) / audio_s if audio_s > 0.0 else None,
        audio_ms=audio_s * 1000.0,
        num_chunks=len(chunks),
        inter_chunk_gaps_ms=gaps_ms,
        max_inter_chunk_gap_ms=max(gaps_ms) if gaps_ms else None,
        playback_stalls_ms=playback.stalls_ms,
        num_underruns=playback.num_underruns,
        underrun_ms=playback.underrun_ms,
    )


def _elapsed_ms(start_s: float, end_s: float | None) -> float | None:
    return None if end_s is None else (end_s - start_s) * 1000.0
