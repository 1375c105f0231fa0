"""Decode-graph buckets and staging (host side), on CPU.

Strategy: literal cases for the bucket map; the staged int64/int32 buffers of a 3-row step in
a bucket of 4 are read back and checked field by field: real rows from positions and block
rows, padding rows on the pad block with seq_len 1. Graph capture itself needs CUDA and is
covered in tests/runner_gpu.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.runner.cuda_graphs import DecodeGraphs, bucket_sizes
from backends.runner.kv_cache import KVCache


def test_bucket_sizes_fit_max_num_reqs() -> None:
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 64) == (1, 2, 4, 8, 16, 32)
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 12) == (1, 2, 4, 8, 12)
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 8) == (1, 2, 4, 8)
    assert bucket_sizes((4,), 2) == (2,)


def test_with_decode_chains_the_buckets_reach_every_request() -> None:
    """A chain runs only as one bucket's graph, so the buckets double up to max_num_reqs."""
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 102, True) == (1, 2, 4, 8, 16, 32, 64, 102)
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 32, True) == (1, 2, 4, 8, 16, 32)
    assert bucket_sizes((1, 2, 4, 8, 16, 32), 6, True) == (1, 2, 4, 6)
    assert bucket_sizes((1,), 5, True) == (1, 2, 4, 5)


def test_stage_fills_real_and_padding_rows(qwen3) -> None:
    kv = KVCache(qwen3.num_layers, 9, 4, qwen3.num_kv_heads, qwen3.head_dim, torch.float32, "cpu")
    graphs = DecodeGraphs(qwen3, kv, (1, 2, 4), 3, pad_block=8, max_seq_len=12)
    assert [graphs.bucket_for(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    block_rows = np.array([[5, 1, -1], [0, 2, 3], [7, -1, -1]], dtype=np.int32)
    positions = np.array([6, 9, 0])
    assert graphs.stage([11, 12, 13], positions, block_rows) == 4
    meta = graphs._metas[4]
    assert graphs.token_ids.tolist() == [11, 12, 13, 0]
    assert meta.slot_mapping.tolist() == [1 * 4 + 2, 3 * 4 + 1, 7 * 4, 8 * 4]
    assert meta.seq_lens.tolist() == [7, 10, 1, 1]
    assert meta.context_lens.tolist() == [6, 9, 0, 0]
    assert meta.block_tables[:3].tolist() == block_rows.tolist()
    assert meta.block_tables[3].tolist() == [8, -1, -1]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(graphs.embeds[:4], qwen3.embed_tokens(torch.tensor([11, 12, 13, 0])))


def test_restaging_fewer_rows_pads_the_rest(qwen3) -> None:
    """The staging twins keep what was staged two steps before: a smaller step after larger
    ones must still pad every row past its own (token 0, pad block, seq_len 1, scratch)."""
    kv = KVCache(qwen3.num_layers, 9, 4, qwen3.num_kv_heads, qwen3.head_dim, torch.float32, "cpu")
    graphs = DecodeGraphs(qwen3, kv, (1, 2, 4), 3, pad_block=8, max_seq_len=12, scratch_slot=6)
    block_rows = np.array([[5, 1, -1], [0, 2, 3], [7, -1, -1]], dtype=np.int32)
    for _ in range(2):  # both twins hold a 3-row step
        graphs.stage([11, 12, 13], np.array([6, 9, 0]), block_rows, sample_slots=[2, 3, 0])
    assert graphs.stage([21], np.array([4]), block_rows[1:2], sample_slots=[3]) == 1
    meta = graphs._metas[4]
    assert graphs.token_ids.tolist() == [21, 0, 0, 0]
    assert graphs.positions.tolist() == [4, 0, 0, 0]
    assert meta.slot_mapping.tolist() == [2 * 4, 8 * 4, 8 * 4, 8 * 4]
    assert meta.seq_lens.tolist() == [5, 1, 1, 1]
    assert meta.context_lens.tolist() == [4, 0, 0, 0]
    assert meta.block_tables.tolist() == [[0, 2, 3], [8, -1, -1], [8, -1, -1], [8, -1, -1]]
    assert graphs.sample_slots.tolist() == [3, 6, 6, 6]


@pytest.mark.interpreter
def test_sampler_reads_staged_slots_and_next_positions(qwen3) -> None:
    """With a sampler, `run` draws every bucket row from its staged sampling slot (scratch for
    padding and unsampled rows) at the position after its row, over the forward's logits."""
    kv = KVCache(qwen3.num_layers, 9, 4, qwen3.num_kv_heads, qwen3.head_dim, torch.float32, "cpu")
    seen: list[tuple[list[int], list[int]]] = []

    def sampler(logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor):
        seen.append((slots.tolist(), positions.tolist()))
        return torch.argmax(logits, dim=-1)

    graphs = DecodeGraphs(qwen3, kv, (1, 2, 4), 3, pad_block=8, max_seq_len=12,
                          sampler=sampler, scratch_slot=6)  # fmt: skip
    block_rows = np.array([[5, 1, -1], [0, 2, 3], [7, -1, -1]], dtype=np.int32)
    size = graphs.stage([11, 12, 13], np.array([6, 9, 0]), block_rows, sample_slots=[2, 6, 0])
    hidden, logits, tokens = graphs.run(size)
    assert seen == [([2, 6, 0, 6], [7, 10, 1, 1])]
    assert tokens is not None and tokens.tolist() == torch.argmax(logits, dim=-1).tolist()
    assert not graphs.is_sampling_captured
