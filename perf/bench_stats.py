"""Statistics of one concurrency level: per-group means, then mean / median / P99 across groups.

A group (one benchmark request: `turns_per_group` turns, each its own session) is the unit of
the statistics, as in vLLM-Omni's benchmark: each latency is first averaged over the group's
turns, then summarised across groups (numpy percentiles with linear interpolation, so "P99"
is the 99th percentile of the group means). TTFT and TTFP prefer the server's own value and
fall back to the client's, like the reference harness; both sides are also reported apart.

Failures are counted, never dropped: a failed turn contributes its errors and its failure to
the counts, and whatever latencies it did produce to the means.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from perf.distribution import Distribution
from perf.turn import TurnRecord

# Per-turn values, each averaged per group and then summarised across groups.
METRICS = (
    "ttft_ms", "ttfp_ms", "server_ttft_ms", "server_ttfp_ms", "client_ttft_ms", "client_ttfp_ms",
    "rtf", "audio_ms", "max_gap_ms", "underruns", "underrun_ms",
)


@dataclass(frozen=True, slots=True)
class LevelSummary:
    concurrency: int
    num_groups: int
    failed_groups: int  # groups with at least one failed turn
    num_turns: int
    failed_turns: int
    num_errors: int  # error lines over all turns (server error events, failed requests, timeouts)
    open_retries: int  # STARTs refused with resource_exhausted and retried
    duration_s: float
    audio_s: float  # reply audio received over all turns
    turns_with_underrun: int
    metrics: dict[str, Distribution]  # METRICS over group means
    turn_max_gap_ms: Distribution  # the largest inter-chunk gap of each turn, across turns
    pacing_lateness_ms: Distribution  # worst append lag behind its deadline per turn: the client's own precision
    skipped_turns: int = 0  # planned turns not started because the level's time budget ran out

    @property
    def turns_per_s(self) -> float:
        return self.num_turns / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "turns_per_s": self.turns_per_s}


def turn_values(record: TurnRecord) -> dict[str, float | None]:
    """METRICS of one turn (None where the turn did not produce the value)."""
    m = record.measured
    if m is None:
        return {name: None for name in METRICS}
    return {
        "ttft_ms": _first(m.server_ttft_ms, m.client_ttft_ms),
        "ttfp_ms": _first(m.server_ttfp_ms, m.client_ttfp_ms),
        "server_ttft_ms": m.server_ttft_ms, "server_ttfp_ms": m.server_ttfp_ms,
        "client_ttft_ms": m.client_ttft_ms, "client_ttfp_ms": m.client_ttfp_ms,
        "rtf": m.rtf, "audio_ms": m.audio_ms, "max_gap_ms": m.max_inter_chunk_gap_ms,
        "underruns": float(m.num_underruns), "underrun_ms": m.underrun_ms,
    }


def group_means(group: Sequence[TurnRecord]) -> dict[str, float | None]:
    values = [turn_values(record) for record in group]
    return {name: _mean(v[name] for v in values) for name in METRICS}


def summarize(concurrency: int, groups: Sequence[Sequence[TurnRecord]], duration_s: float,
              append_ms: int = 200) -> LevelSummary:
    turns = [record for group in groups for record in group]
    means = [group_means(group) for group in groups]
    gaps = [turn_values(record)["max_gap_ms"] for record in turns]
    return LevelSummary(
        concurrency=concurrency, num_groups=len(groups),
        failed_groups=sum(not all(r.ok for r in group) for group in groups),
        num_turns=len(turns), failed_turns=sum(not r.ok for r in turns),
        num_errors=sum(len(r.report.errors) for r in turns), open_retries=sum(r.retries for r in turns),
        duration_s=duration_s, audio_s=sum(r.report.reply_audio_ms for r in turns) / 1000.0,
        turns_with_underrun=sum(bool(turn_values(r)["underruns"]) for r in turns),
        metrics={name: Distribution.of(m[name] for m in means) for name in METRICS},
        turn_max_gap_ms=Distribution.of(g for g in gaps if g is not None),
        pacing_lateness_ms=Distribution.of(r.pacing_lateness_ms(append_ms) for r in turns if r.append_times_s),
    )


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
