"""Bucketed layout of a mixed batch (appends next to decodes) for a graphed forward.

A mixed batch of n requests and N rows, every request at most `max_query_len` (Q) rows, runs
in the bucket (R, T): R the smallest request bucket >= n, T the smallest token bucket >= N.
All of its host-dependent layout lives in two flat buffers of fixed size (caps: the largest
R and T), so staging a step is two pinned host -> device copies and a captured graph reads
the same addresses every replay:

- int64 `[3 * max_tokens + max_reqs]`: token ids, positions, KV slot mapping (one entry per
  row), then the logits rows (the last row of each sampling request, in sampling order).
- int32 `[(max_reqs + 1) + 2 * max_reqs + max_reqs * max_blocks]`: query_start_loc,
  seq_lens, context_lens, then the batch-ordered block tables.

Padding: rows N..T-1 are token 0 at position 0 and write their K/V into the reserved pad
block (no request reads it); they belong to no request, and the attention writes zeros
there (`AttentionMetadata.pad_tail`), so they stay finite and feed only their own rows.
Requests n..R-1 hold no rows (query_start_loc stays at N) and no keys (seq_len 0), so their
attention programs find no work. Padded logits rows read row 0. The metadata's host mirrors
hold upper bounds (queries of min(Q, T) rows, sequences of `max_seq_len`): the Triton
launcher sizes its grid and split count from them, and the kernels read the real lengths on
the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from backends.runner.attention import AttentionMetadata
from backends.runner.block_table import PAD_BLOCK_ID

Bucket = tuple[int, int]  # (request bucket R, token bucket T)


def mixed_buckets(
    req_sizes: Sequence[int], token_sizes: Sequence[int], max_query_len: int
) -> tuple[Bucket, ...]:
    """Every (R, T) some mixed batch maps to: n in (R_prev, R] requests holding N in
    (T_prev, T] rows with n + 1 <= N <= n * Q (at least one request has several rows)."""
    reqs, tokens = sorted(set(req_sizes)), sorted(set(token_sizes))
    buckets = []
    for prev_r, r in zip([0, *reqs], reqs):
        for prev_t, t in zip([0, *tokens], tokens):
            if prev_t < r * max_query_len and t >= prev_r + 2:
                buckets.append((r, t))
    return tuple(buckets)


def choose_bucket(
    buckets: Sequence[Bucket], num_rows: Sequence[int], max_query_len: int
) -> Bucket | None:
    """The bucket of a batch whose requests hold `num_rows` rows each; None when a request
    has more than `max_query_len` rows or no bucket holds the batch."""
    if not num_rows or max(num_rows) > max_query_len:
        return None
    num_reqs, num_tokens = len(num_rows), sum(num_rows)
    fits = [(r, t) for r, t in buckets if r >= num_reqs and t >= num_tokens]
    return min(fits, default=None)  # smallest R first, then smallest T


@dataclass(frozen=True, slots=True)
class MixedLayout:
    max_reqs: int  # largest request bucket
    max_tokens: int  # largest token bucket
    max_blocks: int  # block-table columns per request
    max_query_len: int  # Q: rows per request a bucket admits
    max_seq_len: int  # longest sequence (the split count is sized for it)
    block_size: int
    pad_block: int  # reserved KV block that padding rows write to

    @property
    def i64_size(self) -> int:
        return 3 * self.max_tokens + self.max_reqs

    @property
    def i32_size(self) -> int:
        return (self.max_reqs + 1) + 2 * self.max_reqs + self.max_reqs * self.max_blocks

    def stage_i64(
        self,
        num_rows: np.ndarray,
        contexts: np.ndarray,
        block_rows: np.ndarray,
        token_ids: np.ndarray,
        logit_rows: Sequence[int],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """num_rows, contexts: [n] rows and tokens already in KV per request; block_rows:
        [n, max_blocks] int32; token_ids: [N] int64 (0 for injected rows); logit_rows: the
        hidden rows whose logits are computed, in order -> the int64 buffer's contents,
        written over all of `out` when given (a pinned staging twin), else a new array."""
        cap, bs = self.max_tokens, self.block_size
        staged = np.empty(self.i64_size, dtype=np.int64) if out is None else out
        staged[:] = 0
        num_tokens = int(num_rows.sum())
        starts = np.cumsum(num_rows) - num_rows
        req_of_row = np.repeat(np.arange(len(num_rows)), num_rows)
        positions = np.arange(num_tokens) - starts[req_of_row] + contexts[req_of_row]
        pages = block_rows[req_of_row, positions // bs].astype(np.int64)
        staged[:num_tokens] = token_ids
        staged[cap : cap + num_tokens] = positions
        staged[2 * cap : 3 * cap] = self.pad_block * bs
        staged[2 * cap : 2 * cap + num_tokens] = pages * bs + positions % bs
        staged[3 * cap : 3 * cap + len(logit_rows)] = logit_rows
        return staged

    def stage_i32(
        self, num_rows: np.ndarray, contexts: np.ndarray, block_rows: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """The int32 buffer's contents (see the module docstring) for n requests, written over
        all of `out` when given, else a new array."""
        num_reqs, cap = len(num_rows), self.max_reqs
        staged = np.empty(self.i32_size, dtype=np.int32) if out is None else out
        query_start_loc = staged[: cap + 1]
        seq_lens, context_lens = staged[cap + 1 : 2 * cap + 1], staged[2 * cap + 1 : 3 * cap + 1]
        tables = staged[3 * cap + 1 :].reshape(cap, self.max_blocks)
        query_start_loc[:] = int(num_rows.sum())
        query_start_loc[0] = 0
        query_start_loc[1 : num_reqs + 1] = np.cumsum(num_rows)
        seq_lens[:] = 0
        seq_lens[:num_reqs] = contexts + num_rows
        context_lens[:] = 0
        context_lens[:num_reqs] = contexts
        tables[num_reqs:] = PAD_BLOCK_ID
        tables[num_reqs:, 0] = self.pad_block
        tables[:num_reqs] = block_rows
        return staged

    def views(self, i64: torch.Tensor, i32: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of the two device buffers (full capacity)."""
        tok, req = self.max_tokens, self.max_reqs
        return {
            "token_ids": i64[:tok],
            "positions": i64[tok : 2 * tok],
            "slot_mapping": i64[2 * tok : 3 * tok],
            "logit_rows": i64[3 * tok :],
            "query_start_loc": i32[: req + 1],
            "seq_lens": i32[req + 1 : 2 * req + 1],
            "context_lens": i32[2 * req + 1 : 3 * req + 1],
            "block_tables": i32[3 * req + 1 :].view(req, self.max_blocks),
        }

    def metadata(self, i64: torch.Tensor, i32: torch.Tensor, bucket: Bucket) -> AttentionMetadata:
        """The bucket's attention metadata over the device buffers, bounds as host mirrors."""
        reqs, tokens = bucket
        view = self.views(i64, i32)
        bound = np.minimum(np.arange(reqs + 1) * self.max_query_len, tokens).astype(np.int32)
        return AttentionMetadata(
            query_start_loc=view["query_start_loc"][: reqs + 1],
            seq_lens=view["seq_lens"][:reqs],
            context_lens=view["context_lens"][:reqs],
            block_tables=view["block_tables"][:reqs],
            slot_mapping=view["slot_mapping"][:tokens],
            query_start_loc_np=bound,
            seq_lens_np=np.full(reqs, self.max_seq_len, dtype=np.int32),
            block_size=self.block_size,
            backend="triton",
            pad_tail=True,
        )
