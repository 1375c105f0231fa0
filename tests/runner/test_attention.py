"""Paged reference attention vs dense causal attention over contiguous K/V.

Strategy: write random K/V for several requests into a shuffled page pool with `write_kv`,
then compare `paged_attention_reference` with a dense masked softmax computed from the
contiguous tensors: context lengths around the block size, GQA, and query chunks that have
cached context (the lower-right causal case SDPA's `is_causal` gets wrong).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.runner.attention import (
    AttentionMetadata,
    causal_mask_lower_right,
    check_backend,
    paged_attention_reference,
    write_kv,
)

BLOCK_SIZE = 4
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8
# Dense reference and SDPA differ only in float32 summation order.
ATOL = 1e-5


def dense_reference(query, key, value, num_context: int) -> torch.Tensor:
    """query [q, Hq, D], key/value [s, Hkv, D] -> [q, Hq, D] by explicit softmax, GQA by repeat."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,shd->hqs", query, key) * HEAD_DIM**-0.5
    q_index = torch.arange(num_context, num_context + query.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(key.shape[0])[None, :] > q_index, float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), value)


def build_case(context_lens: list[int], query_lens: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    pages = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = sum(pages) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()  # shuffled page pool
    tables = torch.full((len(seq_lens), max(pages)), -1, dtype=torch.int32)
    k_cache = torch.zeros(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    dense, slot_mapping = [], []
    for i, seq_len in enumerate(seq_lens):
        row = [order.pop() for _ in range(pages[i])]
        tables[i, : len(row)] = torch.tensor(row)
        kv = torch.randn(2, seq_len, NUM_KV_HEADS, HEAD_DIM, generator=generator)
        flat = [row[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
        write_kv(k_cache, v_cache, kv[0], kv[1], torch.tensor(flat))  # context + this step
        dense.append(kv)
        slot_mapping += flat[context_lens[i] :]
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(cu),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slot_mapping),
        query_start_loc_np=cu,
        seq_lens_np=np.array(seq_lens, dtype=np.int32),
        block_size=BLOCK_SIZE,
    )
    query = torch.randn(int(cu[-1]), NUM_HEADS, HEAD_DIM, generator=generator)
    return query, k_cache, v_cache, meta, dense


@pytest.mark.parametrize(
    "context_lens,query_lens",
    [
        ([0], [1]),
        ([0, 0, 0], [3, 4, 5]),  # bs - 1, bs, bs + 1 fresh prefills
        ([7, 1, 4, 30], [1, 1, 1, 1]),  # decodes
        ([5, 0, 12], [6, 9, 1]),  # chunks with cached context, mixed with prefill and decode
    ],
)
def test_paged_matches_dense(context_lens: list[int], query_lens: list[int]) -> None:
    query, k_cache, v_cache, meta, dense = build_case(context_lens, query_lens)
    out = paged_attention_reference(query, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    for i, (context, kv) in enumerate(zip(context_lens, dense)):
        rows = slice(int(meta.query_start_loc_np[i]), int(meta.query_start_loc_np[i + 1]))
        expected = dense_reference(query[rows], kv[0], kv[1], context)
        torch.testing.assert_close(out[rows], expected, atol=ATOL, rtol=0)


def test_write_kv_places_rows_at_slot_mapping() -> None:
    k_cache = torch.zeros(3, BLOCK_SIZE, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    key = torch.arange(6.0).view(3, 1, 2)
    write_kv(k_cache, v_cache, key, -key, torch.tensor([5, 0, 11]))
    assert k_cache[1, 1, 0].tolist() == [0.0, 1.0]
    assert k_cache[0, 0, 0].tolist() == [2.0, 3.0]
    assert v_cache[2, 3, 0].tolist() == [-4.0, -5.0]
    assert int((k_cache != 0).sum()) == 5  # nothing else written (row [0, 1] holds one zero)


def test_lower_right_mask_literal() -> None:
    assert causal_mask_lower_right(2, 4, torch.device("cpu")).tolist() == [
        [True, True, True, False],
        [True, True, True, True],
    ]


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match="'flash'.*reference"):
        check_backend("flash")
