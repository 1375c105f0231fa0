"""What each model process holds, as gauges on Triton's metrics endpoint.

A stage publishes its engine's `resource_counts()` (live requests, free and total KV blocks,
codec states, ...), the `duplex` orchestrator its `SessionManager.stats()` (live sessions,
threads). Each count `name` becomes the gauge `minicpmo_<name>{model="<model>",pid="<pid>"}`
on the metrics port (`curl <host>:<metrics_port>/metrics`), read by the leak tests and by
operators; `pid` tells the instances of one model apart (each instance is one stub process).

Triton 2.51 crashed when several threads of one process updated custom metrics
(docs/triton_behaviours.md#custom-metrics), so one `ResourceGauges` is fed by exactly one thread
(a stage's engine thread, the orchestrator's reaper) and creates its families lazily on that same
thread. A gauge is set only when its value changed, which keeps the IPC off the engine's hot path.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "minicpmo_"
# Family descriptions must be identical in every process that registers the family.
DESCRIPTIONS = {
    "requests": "live requests of the stage engine (thinker sessions, talker streams, code2wav windows)",
    "kv_free_blocks": "free KV-cache blocks of the stage runner",
    "kv_blocks": "KV-cache blocks of the stage runner in total",
    "runner_requests": "requests holding a slot in the stage runner",
    "codec_states": "code2wav vocoder states (one per request with an open turn)",
    "codec_sequences": "code2wav (cache_epoch, chunk_seq) trackers, one per request id",
    "codec_pending": "code2wav windows accepted and not yet decoded",
    "codec_slot_waits": "code2wav replies whose first window waits for a free cache-pool slot (code2wav_streams)",
    "voice_cache": "code2wav reference voices held prepared (bounded LRU plus voices in use)",
    "voice_users": "code2wav streams that use a cached reference voice",
    "cuda_graphs": "code2wav CUDA graphs captured (all at load unless a window shape was missed)",
    "graph_eager_calls": "code2wav CUDA calls that ran without a graph (a final window's new HiFT length, or the graph budget spent)",
    "sessions": "open duplex sessions",
    "threads": "Python threads of the model process",
    "session_threads": "worker threads of open duplex sessions (two per session)",
    "stranded_threads": "threads of force-finished sessions still blocked in a stage call",
    "uplink_audio_ms": "uplink audio (ms) the open duplex sessions hold that the Thinker has not taken yet",
    "stage_channels": "gRPC channels of the orchestrator to the stages (pooled or in a call)",
    "stage_idle_streams": "open gRPC streams of pooled stage channels (closed after a few idle seconds)",
    "stage_draining_streams": "pooled stage streams whose abandoned request has not sent its FINAL yet",
    "cuda_peak_allocated_mib": "peak CUDA memory (MiB) the stage's torch allocator has handed out since it became ready",
    "cuda_reserved_mib": "CUDA memory (MiB) the stage's torch allocator holds now (what its memory fraction caps)",
}
MIB = 1 << 20


def cuda_memory_counts() -> dict[str, int]:
    """The process's torch allocator on its GPU, in MiB: the peak handed out since the stage
    became ready (backends/stages/factory.py log_allocation restarts it) and what it holds now
    (the stage's memory share caps it). Empty where the process has not initialised CUDA (CPU
    stages, the orchestrator): torch is not imported for this."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    stats = torch.cuda.memory_stats()  # one read: each call builds a dict of every statistic
    return {"cuda_peak_allocated_mib": stats.get("allocated_bytes.all.peak", 0) // MIB,
            "cuda_reserved_mib": stats.get("reserved_bytes.all.current", 0) // MIB}


class CudaMemoryReader:
    """`cuda_memory_counts` at most every `every_s`: a stage publishes its counts after every
    engine step, and reading the allocator's statistics that often would cost the step time."""

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._clock = every_s, clock
        self._read_at: float | None = None
        self._last: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._every_s:
            self._read_at, self._last = now, cuda_memory_counts()
        return self._last


class ResourceGauges:
    def __init__(self, pb_utils: Any, model: str) -> None:
        self._pb = pb_utils
        self._labels = {"model": model, "pid": str(os.getpid())}
        self._families: dict[str, Any] = {}
        self._gauges: dict[str, Any] = {}
        self._last: dict[str, int] = {}
        self._enabled = True

    def publish(self, counts: dict[str, int]) -> None:
        """Set every gauge whose count changed since the last call (one thread only)."""
        if not self._enabled:
            return
        for name, value in counts.items():
            if self._last.get(name) == value:
                continue
            try:
                self._gauge(name).set(float(value))
            except Exception as exc:  # metrics off (--allow-metrics=false) or a stub error
                log.warning("resource gauges disabled for %s: %r", self._labels["model"], exc)
                self._enabled = False
                return
            self._last[name] = value

    def close(self) -> None:
        """Delete the gauges, then their families (on the metrics thread, before it stops)."""
        self._enabled = False
        self._gauges.clear()
        self._families.clear()

    def _gauge(self, name: str) -> Any:
        gauge = self._gauges.get(name)
        if gauge is None:
            family_cls = self._pb.MetricFamily
            family = family_cls(name=PREFIX + name, description=DESCRIPTIONS.get(name, name),
                                kind=family_cls.GAUGE)
            self._families[name] = family  # a Metric must not outlive its family
            gauge = self._gauges[name] = family.Metric(labels=self._labels)
        return gauge


def parse_gauges(metrics_text: str) -> dict[tuple[str, str], float]:
    """{(count name, model): value summed over instances} of the `minicpmo_*` gauges of a
    /metrics page."""
    values: dict[tuple[str, str], float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(PREFIX) or "{" not in line:
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head[len(PREFIX):].partition("{")
        model = _label(labels.rstrip("}"), "model")
        if model is not None:
            values[(name, model)] = values.get((name, model), 0.0) + float(value)
    return values


def _label(labels: str, key: str) -> str | None:
    for item in labels.split(","):
        k, _, v = item.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None
