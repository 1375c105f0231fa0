"""Triton paged attention vs the reference backend (Triton's interpreter on CPU, float32).

Strategy: reuse the attention tests' case builder (random K/V in a shuffled page pool, block
size 4) and compare the kernel with `paged_attention_reference` on decodes, fresh prefills and
chunks with cached context, with one split (direct store) and forced splits (the merge
kernel), for GQA groups of 1, 2 and 4. Skipped where Triton is not installed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import test_attention as cases  # noqa: E402  (the sibling module's case builder)

from backends.runner.attention import paged_attention_reference  # noqa: E402
from backends.runner.triton_paged_attention import (  # noqa: E402
    TILE_N,
    num_kv_splits,
    paged_attention_triton,
)

# Interpreted float32 math vs SDPA in float32: only summation order differs.
ATOL = 2e-6
SHAPES = [
    ([0], [1]),
    ([7, 1, 4, 30], [1, 1, 1, 1]),
    ([5, 0, 12], [6, 9, 1]),
    ([90, 3], [1, 40]),  # several key tiles, and a query longer than one query tile
]
# The interpreter's own numpy deprecation noise, once per program.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(params=[(4, 4), (8, 2)], ids=["group1", "group4"])
def heads(request, monkeypatch) -> None:
    num_heads, num_kv_heads = request.param
    monkeypatch.setattr(cases, "NUM_HEADS", num_heads)
    monkeypatch.setattr(cases, "NUM_KV_HEADS", num_kv_heads)
    monkeypatch.setattr(cases, "HEAD_DIM", 16)  # tl.dot needs >= 16 on a GPU


@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("context_lens,query_lens", SHAPES)
def test_matches_reference(heads, context_lens, query_lens, splits) -> None:
    query, k_cache, v_cache, meta, _ = cases.build_case(context_lens, query_lens, seed=3)
    scale = cases.HEAD_DIM**-0.5
    expected = paged_attention_reference(query, k_cache, v_cache, meta, scale)
    out = paged_attention_triton(query, k_cache, v_cache, meta, scale, splits=splits)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_split_heuristic_bounds() -> None:
    assert num_kv_splits(num_programs=8, max_seq_len=4096, num_sms=132) == 33
    assert num_kv_splits(num_programs=8, max_seq_len=100, num_sms=132) == -(-100 // TILE_N)
    assert num_kv_splits(num_programs=1024, max_seq_len=4096, num_sms=132) == 1
    assert num_kv_splits(num_programs=1, max_seq_len=10**6, num_sms=132) == 64


class _Recorder:
    """Stands in for a jitted kernel: records each launch's constexpr arguments."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys, self.seen = keys, set()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.seen.add(tuple(kwargs[k] for k in self.keys))


def test_warm_variants_compile_every_variant_a_batch_can_launch(monkeypatch) -> None:
    """The warm-up launches each (row tile, split) attention variant and each (merge width,
    padded tail) merge variant that any batch of up to 64 requests, 600 query rows and 8192
    keys would launch (the launch-shape heuristic at the Thinker's heads on a 132-SM GPU), and
    reads the caches only."""
    import numpy as np
    import triton

    from backends.runner import triton_paged_attention as tpa

    num_heads, num_kv_heads, head_dim, page = 32, 8, 16, 4
    k_cache = torch.randn(3, page, num_kv_heads, head_dim)
    v_cache, before = torch.randn_like(k_cache), k_cache.clone()
    assert tpa.warm_variants(k_cache, v_cache, num_heads, blocks_per_req=5) == 28
    assert torch.equal(k_cache, before)
    attention = _Recorder(("BLOCK_Q", "IS_SPLIT"))
    merge = _Recorder(("SPLITS_PAD", "ZERO_TAIL"))
    monkeypatch.setattr(tpa, "_paged_attention_kernel", attention)
    monkeypatch.setattr(tpa, "_merge_splits_kernel", merge)
    tpa.warm_variants(k_cache, v_cache, num_heads, blocks_per_req=5)
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    needed_attention, needed_merge = set(), set()
    for num_reqs in (1, 2, 3, 8, 16, 33, 64):
        for query_len in (1, 2, 13, 64, 150, 600):
            for seq_len in (query_len, 64, 300, 1000, 4096, 8192):
                meta = tpa._one_request_meta(1, 1, page, torch.device("cpu"), False)
                meta = dataclasses.replace(
                    meta, query_start_loc_np=np.arange(num_reqs + 1, dtype=np.int32) * query_len,
                    seq_lens_np=np.full(num_reqs, max(seq_len, query_len), np.int32))
                block_q, _, splits = tpa._launch_shape(meta, group_pad, num_kv_heads, meta.seq_lens.device)
                for pad_tail in (False, True):
                    split = splits > 1 or pad_tail
                    needed_attention.add((block_q, split))
                    if split:
                        needed_merge.add((triton.next_power_of_2(splits), pad_tail))
    assert needed_attention <= attention.seen and len(attention.seen) == 4
    assert needed_merge <= merge.seen and len(merge.seen) == 13  # (1, padded) + 6 widths x 2
