"""Decode batches through persistent buffers and one CUDA graph per batch-size bucket.

A decode batch (one row per request) of n rows runs in the smallest bucket >= n. Every tensor
the captured forward reads lives in a buffer allocated once here: token ids, positions and slot
mappings in one int64 tensor, sequence lengths and batch-ordered block tables in one int32
tensor (so staging a step is two pinned host -> device copies), the input embeddings, and a
constant `query_start_loc`. Rows past n are padding: token 0 at position 0, writing its K/V
into the reserved pad block and attending to that block alone, so they never touch a request's
pages. The graph's outputs (final hidden rows and float32 logits) are static tensors that the
next replay overwrites: read them, or copy them, before the next step.

With a `sampler` (runners with a `DeviceLogitsProcessor`), each bucket also gets a sampling
graph replayed right after its forward: processor, draw and processor update over the
forward's static logits, reading each row's sampling slot (staged with the ids; padding rows
and rows sampled elsewhere point at the scratch slot) and writing a static token tensor. So a
decode step's sampling costs one graph launch instead of ~80 eager kernel launches.

`advance` turns a staged batch into its next decode step on the device (drawn tokens in,
positions and lengths + 1, KV slots from the staged block-table rows; one kernel,
`chain_advance`): decode chains (`decode_chain`) run several steps over these buffers without
the host.

Graphs are captured largest bucket first into one shared memory pool, after the KV cache
exists (its address is baked in). Without CUDA (or with graphs off) `run` executes the same
forward and sampler eagerly over the same buffers, so this path is testable on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from backends.runner.attention import AttentionMetadata
from backends.runner.backbone import DecoderModel
from backends.runner.block_table import PAD_BLOCK_ID
from backends.runner.host_staging import PinnedStaging
from backends.runner.kv_cache import KVCache

_LOG = logging.getLogger(__name__)

# (logits [rows, vocab] float32, slots [rows] int64, positions [rows] int64) -> [rows] int64
RowSampler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_Output = TypeVar("_Output")


def bucket_sizes(
    requested: Sequence[int], max_num_reqs: int, cover_every_batch: bool = False
) -> tuple[int, ...]:
    """The requested sizes that fit `max_num_reqs`, plus the largest batch that can occur
    when it falls between two requested sizes. `cover_every_batch` (decode chains, which run
    only as graphs of a bucket) goes on doubling past the requested sizes up to every request."""
    largest = min(max_num_reqs, max(requested))
    sizes = {size for size in requested if size <= max_num_reqs} | {largest}
    while cover_every_batch and largest < max_num_reqs:
        largest = min(2 * largest, max_num_reqs)
        sizes.add(largest)
    return tuple(sorted(sizes))


class DecodeGraphs:
    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        sizes: Sequence[int],
        max_blocks_per_req: int,
        pad_block: int,
        max_seq_len: int,
        sampler: RowSampler | None = None,
        scratch_slot: int = 0,
    ) -> None:
        self.model = model
        self.kv = kv
        self.sizes = tuple(sorted(sizes))
        self.capacity = self.sizes[-1]
        self.max_blocks_per_req = max_blocks_per_req
        self.pad_block = pad_block
        self.max_seq_len = max_seq_len
        self.sampler = sampler
        self.scratch_slot = scratch_slot
        device, cap = kv.data.device, self.capacity
        # [4, capacity] int64: token ids, positions, KV slot mapping, sampling slots
        self._i64 = torch.zeros(4, cap, dtype=torch.int64, device=device)
        # [capacity * (2 + max_blocks_per_req)] int32: seq_lens, context_lens, block tables
        self._i32 = torch.zeros(cap * (2 + max_blocks_per_req), dtype=torch.int32, device=device)
        self._i64_staging, self._i32_staging = PinnedStaging(self._i64), PinnedStaging(self._i32)
        self.query_start_loc = torch.arange(cap + 1, dtype=torch.int32, device=device)
        # [capacity, hidden] input embeddings in the KV dtype
        self.embeds = torch.zeros(cap, model.hidden_size, dtype=kv.data.dtype, device=device)
        self._metas = {size: self._metadata(size) for size in self.sizes}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._sample_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def token_ids(self) -> torch.Tensor:
        return self._i64[0]  # [capacity] int64

    @property
    def positions(self) -> torch.Tensor:
        return self._i64[1]  # [capacity] int64

    @property
    def sample_slots(self) -> torch.Tensor:
        return self._i64[3]  # [capacity] int64

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

    @property
    def is_sampling_captured(self) -> bool:
        return bool(self._sample_graphs)

    def bucket_for(self, num_rows: int) -> int | None:
        """The smallest bucket holding `num_rows` rows, None if none does."""
        return next((size for size in self.sizes if size >= num_rows), None)

    def _metadata(self, size: int) -> AttentionMetadata:
        cap, blocks = self.capacity, self.max_blocks_per_req
        # Host mirrors are upper bounds here: the Triton launcher sizes its grid from them,
        # and the real lengths are read on the device at replay.
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self._i32[:size],
            context_lens=self._i32[cap : cap + size],
            block_tables=self._i32[2 * cap :].view(cap, blocks)[:size],
            slot_mapping=self._i64[2, :size],
            query_start_loc_np=np.arange(size + 1, dtype=np.int32),
            seq_lens_np=np.full(size, self.max_seq_len, dtype=np.int32),
            block_size=self.kv.block_size,
            backend="triton",
        )

    def stage(
        self,
        token_ids: Sequence[int],
        positions: np.ndarray,
        block_rows: np.ndarray,
        injected: Sequence[tuple[int, torch.Tensor]] = (),
        sample_slots: Sequence[int] | None = None,
    ) -> int:
        """Fill the buffers for one decode step of n = len(token_ids) rows; returns the bucket.

        positions: [n] int64 logical KV index of each row; block_rows: [n, max_blocks] int32
        the rows' block-table rows; injected: (row, [hidden] embedding) pairs that replace the
        token embedding of that row (its token id is not looked up); sample_slots: [n] the
        slot whose sampling state each row's token is drawn with (default: the scratch slot).
        """
        num_rows = len(token_ids)
        size = self.bucket_for(num_rows)
        if size is None:
            raise ValueError(f"{num_rows} decode rows exceed the largest bucket {self.capacity}")
        self._fill_i64(self._i64_staging.host(), token_ids, positions, block_rows, sample_slots)
        self._fill_i32(self._i32_staging.host(), positions, block_rows)
        self._i64_staging.publish()
        self._i32_staging.publish()
        self.embeds[:size].copy_(self.model.embed_tokens(self.token_ids[:size]))
        for row, embedding in injected:
            if self.embeds.device.type == "cuda" and embedding.device.type == "cpu":
                embedding = embedding.pin_memory()  # a pageable source would block the host
            self.embeds[row].copy_(embedding, non_blocking=True)
        return size

    def advance(self, size: int, tokens: torch.Tensor) -> None:
        """Turn the staged bucket into its next decode step on the device (decode chains):
        each staged row (sampling slot not the scratch one) takes its drawn token (`tokens`
        [size] int64) as input, moves one position on and looks its KV slot up in its staged
        block-table row; padding rows stay as staged. Queues device work only."""
        from backends.runner.chain_advance import advance_rows  # Triton: fast path only

        advance_rows(
            self._i64, self._i32, tokens.contiguous(), size, self.scratch_slot,
            self.kv.block_size, self.max_blocks_per_req,
        )  # fmt: skip
        self.embeds[:size].copy_(self.model.embed_tokens(self._i64[0, :size]))

    def _fill_i64(self, out: np.ndarray, token_ids: Sequence[int], positions: np.ndarray,
                  block_rows: np.ndarray, sample_slots: Sequence[int] | None) -> None:
        """Write all of `out` ([4, capacity]): token ids, positions, KV slots, sampling slots;
        padding rows are token 0 at position 0 writing to the pad block, scratch slot."""
        num_rows, bs = len(token_ids), self.kv.block_size
        out[:2] = 0
        out[0, :num_rows] = token_ids
        out[1, :num_rows] = positions
        out[2, :] = self.pad_block * bs
        pages = block_rows[np.arange(num_rows), positions // bs].astype(np.int64)
        out[2, :num_rows] = pages * bs + positions % bs
        out[3, :] = self.scratch_slot
        out[3, :num_rows] = self.scratch_slot if sample_slots is None else sample_slots

    def _fill_i32(self, out: np.ndarray, positions: np.ndarray, block_rows: np.ndarray) -> None:
        """Write all of `out`: seq_lens, context_lens, block tables ([capacity] each, then
        [capacity, max_blocks]); a padding row sees its own pad-block key only."""
        num_rows, cap = len(positions), self.capacity
        seq_lens, context_lens = out[:cap], out[cap : 2 * cap]
        tables = out[2 * cap :].reshape(cap, self.max_blocks_per_req)
        seq_lens[:] = 1
        seq_lens[:num_rows] = positions + 1
        context_lens[:] = 0
        context_lens[:num_rows] = positions
        tables[num_rows:] = PAD_BLOCK_ID
        tables[num_rows:, 0] = self.pad_block
        tables[:num_rows] = block_rows

    def run(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Forward (and sample) the staged bucket: ([size, hidden] final hidden, [size, vocab]
        float32 logits, [size] int64 tokens or None without a sampler). Replays the bucket's
        graphs when captured; static outputs then."""
        graph = self._graphs.get(size)
        if graph is None:
            hidden, logits = self.forward_eager(size)
        else:
            graph.replay()
            hidden, logits = self._outputs[size]
        if self.sampler is None:
            return hidden, logits, None
        captured = self._sample_graphs.get(size)
        if captured is None:
            return hidden, logits, self.sample_eager(size, logits)
        captured[0].replay()
        return hidden, logits, captured[1]

    def replay(self, size: int) -> None:
        """Replay a captured bucket on whatever is staged (benchmarks time this)."""
        self._graphs[size].replay()

    def forward_eager(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's forward without the graph (what capture records; profiling uses it)."""
        hidden = self.model.forward(
            self.embeds[:size], self._i64[1, :size], self._metas[size], self.kv
        )
        return hidden, self.model.compute_logits(hidden)

    def sample_eager(self, size: int, logits: torch.Tensor) -> torch.Tensor:
        """The bucket's sampling without its graph: [size] int64 (what capture records).
        Staged positions are the rows' own; each token sits one after its row."""
        assert self.sampler is not None
        return self.sampler(logits, self._i64[3, :size], self._i64[1, :size] + 1)

    def capture(self, warmup_steps: int = 2, pool: tuple[int, int] | None = None) -> None:
        """Capture every bucket, largest first, sharing one pool (`pool`, else a fresh one).
        Stages padding rows only, so warm-up and capture write K/V into the pad block alone
        and sample the scratch slot."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        side = torch.cuda.Stream()  # every warm-up on one stream: its cached blocks are reused
        empty_rows = np.zeros((0, self.max_blocks_per_req), dtype=np.int32)
        for size in reversed(self.sizes):
            self.stage([], np.zeros(0, dtype=np.int64), empty_rows)
            self._graphs[size], self._outputs[size] = capture_graph(
                lambda: self.forward_eager(size), pool, warmup_steps, side
            )
            if self.sampler is not None:
                self._capture_sampling(size, pool, warmup_steps, side)
        torch.cuda.synchronize()

    def _capture_sampling(self, size: int, pool: tuple[int, int], warmup_steps: int,
                          side: torch.cuda.Stream) -> None:
        logits = self._outputs[size][1]
        try:
            self._sample_graphs[size] = capture_graph(
                lambda: self.sample_eager(size, logits), pool, warmup_steps, side
            )
        except RuntimeError:  # a kernel that cannot be captured: sample eagerly, still no sync
            _LOG.warning("sampling graph capture failed for bucket %d", size, exc_info=True)


def capture_graph(
    run: Callable[[], _Output], pool: tuple[int, int], warmup_steps: int,
    side: torch.cuda.Stream | None = None,
) -> tuple[torch.cuda.CUDAGraph, _Output]:
    """Warm `run` up on a side stream (`side`, or a new one), then capture it; returns (graph,
    its static output). The allocator caches blocks per stream: a caller capturing many graphs
    passes one `side` for all, or each warm-up's blocks stay reserved apart."""
    side = side if side is not None else torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_steps):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output
