"""CUDA graphs for the fixed-shape parts of a window: the conformer encoder, the CFM's ten-step
solve (about 11k of the ~12k kernels of a window, docs/model_facts.md#code2wav-windows) and the
HiFT with its ISTFT.

`GraphRunner` captures a function once per input shape and replays it: inputs are copied into
the graph's static tensors, outputs are the graph's own tensors (valid until that graph is
replayed again; a runner's graphs share one memory pool, but each holds its outputs, so
replaying one never overwrites another's). On a device other than CUDA it simply calls the function, which keeps the
bucketing below testable on CPU.

`SolverGraphs` pads a window to a few shape buckets (frames to one of `FRAME_BUCKETS`, cache
length up to a multiple of `CACHE_STEP`): padded frames and cache slots are masked keys and
come after every real frame in causal order, so they change nothing (checked by tests), and
steady streaming hits one graph per batch bucket (the pooled solver and the encoder pad the
batch too: batch_buckets.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from backends.models.token2wav.batch_buckets import (
    batch_bucket,
    pad_encoder_batch,
    pad_pooled_batch,
    pad_rows,
    unpad_solver_outputs,
)
from backends.models.token2wav.batching import right_pad
from backends.models.token2wav.cfm import (
    CausalConditionalCFM,
    PooledSolverInputs,
    SolverInputs,
    SolverOutputs,
)
from backends.models.token2wav.encoder import UpsampleConformerEncoderV2
from backends.models.token2wav.encoder_packing import (
    EncoderInputs,
    EncoderOutputs,
    pad_encoder_inputs,
)
from backends.models.token2wav.hift import HiFTGenerator
from backends.runner.cuda_graphs import capture_graph
from backends.runner.host_staging import to_device

# Mel frames: 50 for every first, growing and steady window, 6-54 for a turn's final window (3
# context + 0-24 new codes). A solve is bound by its kernel count, not its frames, so a final
# window pads to 50 and replays a steady window's graph (captured at load) instead of capturing
# one of its own mid-reply; 56 holds the 23-24-code final windows.
FRAME_BUCKETS = (50, 56)
log = logging.getLogger(__name__)
CACHE_STEP = 50  # one window's mel frames: first, second and steady windows hit exact sizes
DEFAULT_MAX_GRAPHS = 48
_WARMUP_RUNS = 2  # library plans and allocator pools settle before capture


@dataclass(frozen=True, slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]


class GraphRunner:
    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], max_graphs: int) -> None:
        if max_graphs < 0:
            raise ValueError(f"max_graphs must be >= 0, got {max_graphs}")
        self.fn = fn
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, _Graph] = {}
        self.eager_calls = 0  # CUDA calls that ran without a graph (budget spent, capture failed, sealed)
        self.sealed = False  # no more captures: a new shape runs eagerly (see `seal`)
        # One memory pool for all of this runner's graphs: they replay one at a time and their
        # callers copy what they keep before the next call (as with one graph replayed twice).
        # A pool per graph held every batch x length bucket's activations at once, and under
        # the stage's memory cap cuDNN then found no workspace in a later capture.
        self._pool: Any = None
        self._side: Any = None  # the warm-up stream of every capture, made with the pool

    def num_graphs(self) -> int:
        return len(self._graphs)

    def seal(self) -> None:
        """Capture nothing more: shapes seen so far replay, others run eagerly. For a part whose
        eager run costs less than a capture's stall (two eager runs and the capture)."""
        self.sealed = True

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if inputs[0].device.type != "cuda":
            return self.fn(*inputs)
        key = tuple((t.shape, t.dtype) for t in inputs)  # torch.Size is a tuple already
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= self.max_graphs or self.sealed:
                self.eager_calls += 1
                return self.fn(*inputs)  # beyond the budget or sealed: eager, same result
            try:
                entry = self._graphs[key] = self._capture(inputs)
            except RuntimeError as exc:  # e.g. no cuDNN workspace under the memory cap
                log.warning("CUDA graph capture for %s failed (%s); eager from now on", key, exc)
                self.max_graphs = len(self._graphs)
                torch.cuda.synchronize()
                self.eager_calls += 1
                return self.fn(*inputs)
        for static, value in zip(entry.inputs, inputs):
            static.copy_(value)
        entry.graph.replay()
        return entry.outputs

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Graph:
        static = tuple(t.clone() for t in inputs)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._side = torch.cuda.Stream()  # every warm-up on one stream: blocks reused
        graph, outputs = capture_graph(lambda: self.fn(*static), self._pool, _WARMUP_RUNS,
                                       self._side)
        return _Graph(graph, static, tuple(outputs))


class SolverGraphs:
    """Replaces `CausalConditionalCFM.solve` with bucketed graph replays."""

    def __init__(self, cfm: CausalConditionalCFM, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.runner = GraphRunner(lambda *flat: _fields(cfm.solve(SolverInputs(*flat))), max_graphs)

    def __call__(self, inputs: SolverInputs) -> SolverOutputs:
        frames, cached = inputs.mu.shape[2], inputs.att.shape[4]
        padded = pad_solver_inputs(inputs, frame_bucket(frames), cache_bucket(cached))
        mel, new_kv, cnn = self.runner(*_fields(padded))
        return SolverOutputs(mel[:, :, :frames], new_kv[:, :, :, :, :frames], cnn)


class PooledSolverGraphs:
    """Replaces `EstimatorPool.solver` with bucketed graph replays; the pool's tensor is
    read in place by every graph (captured by address, never copied), so a graph stays valid
    as long as the pool does."""

    def __init__(self, cfm: CausalConditionalCFM, pool: torch.Tensor, zero_position: int,
                 max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.zero_position = zero_position
        self.runner = GraphRunner(
            lambda *flat: _fields(cfm.solve_pooled(PooledSolverInputs(*flat), pool)), max_graphs)

    def __call__(self, inputs: PooledSolverInputs) -> SolverOutputs:
        rows, frames, cached = inputs.mu.shape[0], inputs.mu.shape[2], inputs.order.shape[1]
        padded = pad_pooled_inputs(inputs, frame_bucket(frames), cache_bucket(cached),
                                   self.zero_position)
        outputs = self.runner(*_fields(pad_pooled_batch(padded, batch_bucket(rows))))
        return unpad_solver_outputs(SolverOutputs(*outputs), rows, frames)


class EncoderGraphs:
    """Replaces `UpsampleConformerEncoderV2.run` (or `run`, a pass around it such as the
    flow's `run_encoder`) with bucketed graph replays: code frames to half a `FRAME_BUCKETS`
    entry, caches to multiples of `CACHE_STEP` (mel rate) and half of it (token rate)."""

    def __init__(self, encoder: UpsampleConformerEncoderV2,
                 max_graphs: int = DEFAULT_MAX_GRAPHS,
                 run: Callable[[EncoderInputs], EncoderOutputs] | None = None) -> None:
        self.stride = encoder.config.up_stride
        run = encoder.run if run is None else run
        self.runner = GraphRunner(lambda *flat: _fields(run(EncoderInputs(*flat))), max_graphs)

    def padded_sizes(self, frames: int, token_cached: int, mel_cached: int,
                     ) -> tuple[int, int, int]:
        """The bucket of a window: (code frames, token-rate cache, mel-rate cache) -> at least
        as large (`pack_encoder_inputs` packs at these sizes at once)."""
        return (frame_bucket(self.stride * frames) // self.stride,
                _round_up(token_cached, CACHE_STEP // self.stride), cache_bucket(mel_cached))

    def __call__(self, inputs: EncoderInputs) -> EncoderOutputs:
        frames = inputs.token_valid.shape[1] - inputs.token_kv.shape[3]
        padded = pad_encoder_inputs(  # a no-op for a window packed at `padded_sizes`
            inputs, *self.padded_sizes(frames, inputs.token_kv.shape[3], inputs.mel_kv.shape[3]))
        rows, bucket = inputs.xs.shape[0], batch_bucket(inputs.xs.shape[0])
        features, *rest = self.runner(*_fields(pad_encoder_batch(padded, bucket)))
        if rows < bucket:
            rest = [t[:rows] for t in rest]
        return EncoderOutputs(features[:rows, : self.stride * frames], *rest)


class HiFTGraphs:
    """`HiFTGenerator.forward` replayed from graphs, ISTFT included (`uniform_forward`: its
    envelope check runs once per length, in the warm-up before capture)."""

    def __init__(self, hift: HiFTGenerator, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.hift = hift
        self.runner = GraphRunner(hift.uniform_forward, max_graphs)

    def __call__(self, mel: torch.Tensor, source_cache: list[torch.Tensor],
                 noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (speech, source) of the B streams: the caller copies what it keeps. Caches of
        any lengths go in as one zero-padded tensor with their lengths (a new stream's empty
        one beside steady ones), the batch padded to its bucket."""
        rows, bucket = mel.shape[0], batch_bucket(mel.shape[0])
        lengths = to_device(np.array([cached.shape[0] for cached in source_cache], np.int64), mel.device)
        cache = right_pad(source_cache, dim=0)
        speech, source = self.runner(*(pad_rows(t, bucket) for t in (mel, cache, noise, lengths)))
        return speech[:rows], source[:rows]


def graph_counts(*parts: object) -> dict[str, int]:
    """CUDA graphs captured by the parts' GraphRunners and their calls that ran eagerly on CUDA
    (the graph budget spent, a capture failed, or sealed): a capture or an eager call while
    serving is a latency spike, so the serving layer publishes both. Parts without a runner
    (plain callables, None) count nothing."""
    runners = [r for r in (getattr(p, "runner", None) for p in parts) if isinstance(r, GraphRunner)]
    return {"cuda_graphs": sum(r.num_graphs() for r in runners),
            "graph_eager_calls": sum(r.eager_calls for r in runners)}


def _round_up(length: int, step: int) -> int:
    return -(-length // step) * step


def _fields(contract: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of a solver contract in field order (no copies, unlike `astuple`)."""
    return tuple(getattr(contract, f.name) for f in dataclasses.fields(contract))


def frame_bucket(frames: int) -> int:
    return next((b for b in FRAME_BUCKETS if b >= frames), frames)


def cache_bucket(cached: int) -> int:
    return _round_up(cached, CACHE_STEP)


def pad_solver_inputs(inputs: SolverInputs, frames: int, cached: int) -> SolverInputs:
    """Zero frames after the window and zero cache slots after the cache, all masked out."""
    extra_frames = frames - inputs.mu.shape[2]
    extra_cached = cached - inputs.att.shape[4]
    if extra_frames == 0 and extra_cached == 0:
        return inputs
    window_valid, cache_valid = inputs.key_valid.split([inputs.mu.shape[2], inputs.att.shape[4]], 1)
    return SolverInputs(
        noise=F.pad(inputs.noise, (0, extra_frames)),
        mu=F.pad(inputs.mu, (0, extra_frames)),
        spks=inputs.spks,
        cond=F.pad(inputs.cond, (0, extra_frames)),
        att=F.pad(inputs.att, (0, 0, 0, extra_cached)),
        cnn=inputs.cnn,
        key_valid=torch.cat([F.pad(window_valid, (0, extra_frames)),
                             F.pad(cache_valid, (0, extra_cached))], dim=1),
        num_new=inputs.num_new,
    )


def pad_pooled_inputs(inputs: PooledSolverInputs, frames: int, cached: int,
                      zero_position: int) -> PooledSolverInputs:
    """`pad_solver_inputs` for pooled caches: the added cache entries read the pool's zero
    position and are masked, as the dense path's zero slots."""
    extra_frames = frames - inputs.mu.shape[2]
    extra_cached = cached - inputs.order.shape[1]
    if extra_frames == 0 and extra_cached == 0:
        return inputs
    window_valid, cache_valid = inputs.key_valid.split(
        [inputs.mu.shape[2], inputs.order.shape[1]], 1)
    return dataclasses.replace(
        inputs,
        noise=F.pad(inputs.noise, (0, extra_frames)),
        mu=F.pad(inputs.mu, (0, extra_frames)),
        cond=F.pad(inputs.cond, (0, extra_frames)),
        key_valid=torch.cat([F.pad(window_valid, (0, extra_frames)),
                             F.pad(cache_valid, (0, extra_cached))], dim=1),
        order=F.pad(inputs.order, (0, extra_cached), value=zero_position),
    )
