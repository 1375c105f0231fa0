"""The runner's contract types: sampling parameters and hooks, step inputs and results, config.

These are the boundary between a stage (Thinker, Talker) and its `ModelRunner`; see
docs/stage_contracts.md#the-runners-python-contract. Fields may be added, never renamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from backends.runner.host_draws import TopCandidates


class AdmissionError(RuntimeError):
    """A request cannot be admitted: no free slot, or its KV reservation does not fit."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 -> greedy argmax
    top_k: int = -1  # -1 -> off
    top_p: float = 1.0
    # HF-style (divide positive / multiply negative logits) over the last `penalty_window`
    # generated tokens
    repetition_penalty: float = 1.0
    penalty_window: int = 0  # 0 -> all generated tokens
    seed: int = 0  # sampling is a pure function of (seed, position, logits)

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.penalty_window < 0:
            raise ValueError(f"penalty_window must be >= 0, got {self.penalty_window}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class SampleContext:
    request_id: str
    position: int  # position of the token being sampled; key a hook's own noise on it and the
    # request's seed (`sampler.step_seed`), so a draw never depends on the batch around it
    # this request's generated-token history (most recent last); the runner's live list, so
    # read it, never mutate it
    generated: list[int]
    # the row's largest logits before any mask or penalty (`host_draws.TopCandidates`), where
    # the runner took them on the device; a hook passes them to `filtered_draw` only if all
    # it did to the row was lower logits (masks, a repetition penalty >= 1)
    candidates: TopCandidates | None = None


class SamplingHook(Protocol):
    """A stage's sampling policy, applied to one row of logits of one request.

    A hook may also offer `before_sample_compact(row: host_rows.CompactRow, ctx) -> int | None`,
    the same decision from a summary of the raw row; the fast path then copies only that
    summary to the host (on CUDA; RunnerConfig.compact_rows_on_cpu) and, where it returns None,
    draws on the whole row as after `before_sample`. And `decide_compact(row, ctx)`, the same as a
    generator that yields its `host_draws.DrawRequest` and takes the drawn token back, which
    the fast path prefers: a step's hooked rows then draw together (`host_draws.run_together`)."""

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        """`logits`: [vocab] float32, may be modified in place; return a token id to force it."""
        ...

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        """May rewrite the sampled token; returns the final token."""
        ...


class DeviceLogitsProcessor(Protocol):
    """A stage's sampling policy as per-slot device tables: the device counterpart of a hook.

    Installed on a runner (`ModelRunner(..., logits_processor=...)`), it sees every row the
    runner samples without a host hook or HF penalty: `apply` before the draw, `update` after
    it, both with the rows' slots, so it reads and writes its state by slot on the device. Both
    must queue tensor work only (no host reads, shapes fixed by the row count) so they run
    inside a captured CUDA graph and on CPU tensors alike. Rows whose slot the stage does not
    manage (and the scratch slot `max_num_reqs`, used by graph padding) must pass unchanged.
    It may also offer a `FusedDraw` as its attribute `fused_draw`.
    """

    def reset_slot(self, slot: int) -> None:
        """Called when `slot` is handed to a new request: forget the previous owner."""
        ...

    def apply(self, logits: torch.Tensor, slots: torch.Tensor) -> None:
        """logits: [rows, vocab] float32, modified in place; slots: [rows] int64."""
        ...

    def update(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """tokens: [rows] int64 drawn -> [rows] int64 final (may force some); advances state."""
        ...


class FusedDraw(Protocol):
    """A processor's `apply`, the device draw and `update` fused into one device step.

    A `DeviceLogitsProcessor` may offer one as its attribute `fused_draw` (None: it has none);
    the fast path then calls it on CUDA in place of apply -> `sample_on_device` -> update
    (backends/runner/fused_draw.py). It must draw the torch path's tokens for every row and
    sampling parameter (that path is the reference), leave its state as `update` would, and
    queue device work only (graph-capturable). `logits` may be left unedited.
    """

    def __call__(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        floats: torch.Tensor,
        ints: torch.Tensor,
    ) -> torch.Tensor:
        """logits: [rows, vocab] float32; slots, positions (where each token will sit, the
        noise key): [rows] int64; floats: [slots, 2] float32 (temperature, top_p) and ints:
        [slots, 2] int64 (top_k, seed as `as_int64`), the runner's per-slot sampling tables
        -> [rows] int64 final tokens."""
        ...


@dataclass(frozen=True, slots=True)
class StepInput:
    """One request's rows in one forward."""

    request_id: str
    token_ids: list[int]  # ledger ids, one per row (for injected rows: the placeholder id)
    embeds: torch.Tensor | None = None  # [n, hidden] injected input embeddings, or None
    sample: bool = True  # sample one token after the last row
    capture_hidden: bool = False  # return the final hidden state of every row

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError(f"StepInput for {self.request_id!r} has no rows")
        if self.embeds is not None and (
            self.embeds.dim() != 2 or self.embeds.shape[0] != len(self.token_ids)
        ):
            raise ValueError(
                f"StepInput for {self.request_id!r}: embeds shape {tuple(self.embeds.shape)} "
                f"does not match {len(self.token_ids)} rows"
            )

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class StepResult:
    request_id: str
    positions: list[int]  # position of each forwarded row
    token: int | None  # sampled (and hook-rewritten) token, None if sample=False
    hidden: torch.Tensor | None  # [n, hidden] float32 final (post-norm) hidden rows, if captured


@dataclass(frozen=True, slots=True)
class ChainResult:
    """One request's rows of a decode chain (`ModelRunner.decode_chain`)."""

    request_id: str
    positions: list[int]  # position of each forwarded row: K consecutive ones
    tokens: list[int]  # K drawn tokens; tokens[k] was drawn after the row at positions[k]


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    num_blocks: int  # KV pages in the pool
    max_num_reqs: int  # slots in the persistent state tables
    max_model_len: int  # tokens one request may hold in KV at once
    block_size: int = 16  # tokens per KV page
    device: str = "cpu"
    dtype: torch.dtype = torch.float32  # KV cache and activation dtype
    # see backends.runner.attention.ATTENTION_BACKENDS; "triton" selects the fast path
    attention_backend: str = "reference"
    use_cuda_graphs: bool = True  # fast path on CUDA: replay decode batches from graphs
    cuda_graph_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # decode batch-size buckets
    # fast path: graph mixed batches (appends next to decodes) whose requests hold at most
    # `mixed_graph_max_query_len` rows, in buckets (request bucket, token bucket); the request
    # buckets are the decode ones (see backends.runner.mixed_graphs)
    mixed_cuda_graphs: bool = True
    mixed_graph_tokens: tuple[int, ...] = (16, 32, 64, 128, 256, 512)  # token-count buckets
    mixed_graph_max_query_len: int = 32
    # the fast path's matmuls (<= 16 rows): "cublas" (F.linear) or "triton" (skinny_linear)
    gemv_backend: str = "cublas"
    # fast path: decode-chain lengths (K decode steps per host round trip) captured as one
    # CUDA graph per (decode bucket, length); a stage chains only these. None: the stage's
    # default (the Talker's: backends.talker.chain_plan), the runner's none; () = off
    decode_chain_lengths: tuple[int, ...] | None = None
    # fast path: the top candidates handed to host-sampled rows (`host_draws.TopCandidates`)
    # are taken among ids below this (a tokenizer's vocabulary; its padding past it is what a
    # policy masks); 0: the whole row
    candidate_ids: int = 0
    # fast path: hooked rows whose hook offers `before_sample_compact` reach the host as a
    # summary (`host_rows.CompactRow`), not whole, on CUDA (where the whole row is a device
    # copy) and, with compact_rows_on_cpu, on the CPU too (tests); probe_ids are the ids whose
    # raw logits every summary carries
    compact_rows_on_cpu: bool = False
    probe_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_blocks", "max_num_reqs", "max_model_len", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RunnerConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.candidate_ids, int) or self.candidate_ids < 0:
            raise ValueError(f"RunnerConfig.candidate_ids must be >= 0, got {self.candidate_ids!r}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"RunnerConfig.dtype must be a floating dtype, got {self.dtype}")
        sizes = self.cuda_graph_sizes
        if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(
                f"RunnerConfig.cuda_graph_sizes must be positive ints, got {sizes!r}"
            )
        if self.gemv_backend not in ("cublas", "triton"):
            raise ValueError(f"RunnerConfig.gemv_backend must be 'cublas' or 'triton', "
                             f"got {self.gemv_backend!r}")
        if any(not isinstance(n, int) or n < 2 for n in self.decode_chain_lengths or ()):
            raise ValueError(f"RunnerConfig.decode_chain_lengths must be ints >= 2, "
                             f"got {self.decode_chain_lengths!r}")
        tokens, query = self.mixed_graph_tokens, self.mixed_graph_max_query_len
        if any(not isinstance(t, int) or t < 1 for t in tokens) or query < 2:
            raise ValueError(
                "RunnerConfig.mixed_graph_tokens must be positive ints and "
                f"mixed_graph_max_query_len >= 2, got {tokens!r} and {query!r}"
            )

    @property
    def is_fast_path(self) -> bool:
        return self.attention_backend == "triton"

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)
