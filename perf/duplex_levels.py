"""Run one concurrency level of the duplex benchmark: C groups in flight, 2 x C groups in all.

C worker threads share one queue of groups; a worker runs its group's turns back to back (each
turn its own session) and takes the next group, so exactly C sessions are live at any time once
all workers started. Worker i starts `i * stagger_s` late, so the sessions do not all prefill in
the same instant (docs/metrics.md#the-duplex-realtime-benchmark). An optional wall-clock budget
stops workers from starting new turns once it is spent (so a level fits a bounded GPU run); turns
not started are reported as skipped, apart from failures. Around the level: GPU memory is sampled
and the server's metrics are scraped before and after.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from perf.bench_stats import LevelSummary, summarize, turn_values
from perf.gpu_memory import GpuMemorySampler
from perf.stage_breakdown import ServerSeries, UnitEstimate, estimate_units, scrape, server_series
from perf.turn import TurnOptions, TurnRecord, run_turn
from perf.workload import TurnSpec, Workload


@dataclass(frozen=True, slots=True)
class LevelPlan:
    concurrency: int
    num_groups: int
    turns_per_group: int = 4
    stagger_s: float = 0.1
    seed: int = 0
    budget_s: float = 0.0  # > 0: start no new turn after this many seconds of the level

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.num_groups < 1 or self.turns_per_group < 1:
            raise ValueError(f"bad level plan {self}: counts must be >= 1")
        if self.stagger_s < 0 or self.budget_s < 0:
            raise ValueError(f"bad level plan {self}: stagger_s and budget_s must be >= 0")


@dataclass(frozen=True, slots=True)
class LevelResult:
    summary: LevelSummary
    units: UnitEstimate
    server: list[ServerSeries]
    gpu_peak_mib: dict[int, float] | None
    gpu_total_mib: dict[int, float] | None
    groups: list[list[TurnRecord]]

    def to_json(self) -> dict[str, Any]:
        """Everything the report needs, plus one flat object per turn."""
        return {
            "summary": self.summary.to_dict(), "unit_estimate": dataclasses.asdict(self.units),
            "server_metrics": [dataclasses.asdict(s) for s in self.server],
            "gpu_peak_mib": self.gpu_peak_mib, "gpu_total_mib": self.gpu_total_mib,
            "turns": [_turn_json(record) for group in self.groups for record in group],
        }


def run_level(plan: LevelPlan, workload: Workload, options: TurnOptions | Sequence[TurnOptions], run_id: str,
              metrics_url: str | None = None) -> LevelResult:
    """`options`: one per server replica; worker i talks to replica i mod n (sessions split evenly).
    `metrics_url`: comma-separated pages, one per replica; their samples are summed."""
    replicas = [options] if isinstance(options, TurnOptions) else list(options)
    specs = workload.groups(plan.num_groups, plan.turns_per_group, plan.seed)
    before = scrape(metrics_url) if metrics_url else {}
    with GpuMemorySampler() as memory:
        started_s = time.monotonic()
        groups = _run_groups(plan, specs, workload, replicas, f"{run_id}-c{plan.concurrency}")
        duration_s = time.monotonic() - started_s
    after = scrape(metrics_url) if metrics_url else {}
    records = [record for group in groups for record in group]
    append_ms = replicas[0].append_ms
    summary = summarize(plan.concurrency, groups, duration_s, append_ms)
    skipped = plan.num_groups * plan.turns_per_group - len(records)
    return LevelResult(
        summary=dataclasses.replace(summary, skipped_turns=skipped),
        units=estimate_units(records, append_ms),
        server=server_series(before, after),
        gpu_peak_mib=memory.peak_mib, gpu_total_mib=memory.total_mib, groups=groups,
    )


def warm_up(workload: Workload, options: TurnOptions, run_id: str, num_turns: int) -> list[TurnRecord]:
    """Turns run before measuring (first-use costs: allocator growth, lazy init); not counted."""
    if num_turns < 1:
        return []
    specs = workload.groups(1, num_turns, seed=10_000)[0]
    return [run_turn(spec, workload.voices[spec.voice], options, f"{run_id}-warm") for spec in specs]


def _run_groups(plan: LevelPlan, specs: list[list[TurnSpec]], workload: Workload, replicas: list[TurnOptions],
                run_id: str) -> list[list[TurnRecord]]:
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(specs)):
        todo.put(index)
    results: list[list[TurnRecord]] = [[] for _ in specs]
    deadline_s = time.monotonic() + plan.budget_s if plan.budget_s > 0 else float("inf")

    def worker(slot: int) -> None:
        options = replicas[slot % len(replicas)]
        time.sleep(slot * plan.stagger_s)
        while time.monotonic() < deadline_s:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            for spec in specs[index]:
                if time.monotonic() >= deadline_s:
                    return
                results[index].append(run_turn(spec, workload.voices[spec.voice], options, run_id))

    threads = [threading.Thread(target=worker, args=(slot,), name=f"bench-slot-{slot}")
               for slot in range(min(plan.concurrency, len(specs)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [group for group in results if group]


def _turn_json(record: TurnRecord) -> dict[str, Any]:
    spec = record.spec
    return {
        "group": spec.group, "turn": spec.turn, "session_id": record.session_id, "voice": spec.voice,
        "text": spec.text, "reply_units": spec.reply_units, "tokens_per_unit": spec.tokens_per_unit,
        "ok": record.ok, "retries": record.retries, "errors": list(record.report.errors),
        "num_responses": len(record.report.turns), "closed_cleanly": record.report.closed_cleanly,
        "wall_s": record.report.wall_s, "silence_ms": record.report.silence_ms,
        **turn_values(record),
    }
