"""Decode batches through persistent buffers and one CUDA graph per batch-size bucket.

A decode batch (one row per request) of n rows runs in the smallest bucket >= n. Every tensor
the captured forward reads lives in a buffer allocated once here: token ids, positions and slot
mappings in one int64 tensor, sequence lengths and batch-ordered block tables in one int32
tensor (so staging a step is two pinned host -> device copies), the input embeddings, and a
constant `query_start_loc`. Rows past n are padding: token 0 at position 0, writing its K/V
into the reserved pad block and attending to that block alone, so they never touch a request's
pages. The graph's outputs (final hidden rows and float32 logits) are static tensors that the
next replay overwrites: read them, or copy them, before the next step.

Graphs are captured largest bucket first into one shared memory pool, after the KV cache
exists (its address is baked in). Without CUDA (or with graphs off) `run` executes the same
forward eagerly over the same buffers, so this path is testable on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from backends.models.decoder import DecoderModel
from backends.runner.attention import AttentionMetadata
from backends.runner.block_table import PAD_BLOCK_ID
from backends.runner.host_staging import copy_to_device
from backends.runner.kv_cache import KVCache


def bucket_sizes(requested: Sequence[int], max_num_reqs: int) -> tuple[int, ...]:
    """The requested sizes that fit `max_num_reqs`, plus the largest batch that can occur
    when it falls between two requested sizes."""
    sizes = {size for size in requested if size <= max_num_reqs}
    sizes.add(min(max_num_reqs, max(requested)))
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
    ) -> None:
        self.model = model
        self.kv = kv
        self.sizes = tuple(sorted(sizes))
        self.capacity = self.sizes[-1]
        self.max_blocks_per_req = max_blocks_per_req
        self.pad_block = pad_block
        self.max_seq_len = max_seq_len
        device, cap = kv.data.device, self.capacity
        # [3, capacity] int64: token ids, positions, slot mapping
        self._i64 = torch.zeros(3, cap, dtype=torch.int64, device=device)
        # [capacity * (2 + max_blocks_per_req)] int32: seq_lens, context_lens, block tables
        self._i32 = torch.zeros(cap * (2 + max_blocks_per_req), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(cap + 1, dtype=torch.int32, device=device)
        # [capacity, hidden] input embeddings in the KV dtype
        self.embeds = torch.zeros(cap, model.hidden_size, dtype=kv.data.dtype, device=device)
        self._metas = {size: self._metadata(size) for size in self.sizes}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def token_ids(self) -> torch.Tensor:
        return self._i64[0]  # [capacity] int64

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

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
    ) -> int:
        """Fill the buffers for one decode step of n = len(token_ids) rows; returns the bucket.

        positions: [n] int64 logical KV index of each row; block_rows: [n, max_blocks] int32
        the rows' block-table rows; injected: (row, [hidden] embedding) pairs that replace the
        token embedding of that row (its token id is not looked up).
        """
        num_rows = len(token_ids)
        size = self.bucket_for(num_rows)
        if size is None:
            raise ValueError(f"{num_rows} decode rows exceed the largest bucket {self.capacity}")
        copy_to_device(self._i64, self._stage_i64(token_ids, positions, block_rows))
        copy_to_device(self._i32, self._stage_i32(positions, block_rows))
        self.embeds[:size].copy_(self.model.embed_tokens(self.token_ids[:size]))
        for row, embedding in injected:
            if self.embeds.device.type == "cuda" and embedding.device.type == "cpu":
                embedding = embedding.pin_memory()  # a pageable source would block the host
            self.embeds[row].copy_(embedding, non_blocking=True)
        return size

    def _stage_i64(
        self, token_ids: Sequence[int], positions: np.ndarray, block_rows: np.ndarray
    ) -> np.ndarray:
        num_rows, bs = len(token_ids), self.kv.block_size
        staged = np.zeros((3, self.capacity), dtype=np.int64)
        staged[0, :num_rows] = token_ids
        staged[1, :num_rows] = positions
        staged[2, :] = self.pad_block * bs
        pages = block_rows[np.arange(num_rows), positions // bs].astype(np.int64)
        staged[2, :num_rows] = pages * bs + positions % bs
        return staged

    def _stage_i32(self, positions: np.ndarray, block_rows: np.ndarray) -> np.ndarray:
        num_rows, cap = len(positions), self.capacity
        lens = np.zeros((2, cap), dtype=np.int32)
        lens[0, :] = 1  # padding rows see their own (pad block) key only
        lens[0, :num_rows] = positions + 1
        lens[1, :num_rows] = positions
        tables = np.full((cap, self.max_blocks_per_req), PAD_BLOCK_ID, dtype=np.int32)
        tables[:, 0] = self.pad_block
        tables[:num_rows] = block_rows
        return np.concatenate([lens.reshape(-1), tables.reshape(-1)])

    def run(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward the staged bucket: ([size, hidden] final hidden, [size, vocab] float32
        logits). Replays the bucket's graph when captured; static outputs then."""
        graph = self._graphs.get(size)
        if graph is None:
            return self.forward_eager(size)
        graph.replay()
        return self._outputs[size]

    def replay(self, size: int) -> None:
        """Replay a captured bucket on whatever is staged (benchmarks time this)."""
        self._graphs[size].replay()

    def forward_eager(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's forward without the graph (what capture records; profiling uses it)."""
        hidden = self.model.forward(
            self.embeds[:size], self._i64[1, :size], self._metas[size], self.kv
        )
        return hidden, self.model.compute_logits(hidden)

    def capture(self, warmup_steps: int = 2) -> None:
        """Capture every bucket, largest first, sharing one pool. Stages padding rows only,
        so warm-up and capture write K/V into the pad block alone."""
        pool = torch.cuda.graph_pool_handle()
        empty_rows = np.zeros((0, self.max_blocks_per_req), dtype=np.int32)
        for size in reversed(self.sizes):
            self.stage([], np.zeros(0, dtype=np.int64), empty_rows)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup_steps):
                    self.forward_eager(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self.forward_eager(size)
            self._graphs[size] = graph
        torch.cuda.synchronize()
