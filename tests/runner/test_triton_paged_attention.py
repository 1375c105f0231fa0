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
    WIDE_TILE_N,
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


@pytest.mark.parametrize("tile", [TILE_N, WIDE_TILE_N])
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("context_lens,query_lens", SHAPES)
@pytest.mark.interpreter
def test_matches_reference(heads, context_lens, query_lens, splits, tile) -> None:
    query, k_cache, v_cache, meta, _ = cases.build_case(context_lens, query_lens, seed=3)
    scale = cases.HEAD_DIM**-0.5
    expected = paged_attention_reference(query, k_cache, v_cache, meta, scale)
    out = paged_attention_triton(query, k_cache, v_cache, meta, scale, splits=splits, tile=tile)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_split_heuristic_bounds() -> None:
    assert num_kv_splits(num_programs=8, max_seq_len=4096, num_sms=132) == 33
    assert num_kv_splits(num_programs=8, max_seq_len=100, num_sms=132) == -(-100 // TILE_N)
    assert num_kv_splits(num_programs=1024, max_seq_len=4096, num_sms=132) == 1
    assert num_kv_splits(num_programs=1, max_seq_len=10**6, num_sms=132) == 64


def launch_shape(num_reqs: int, query_len: int, seq_len: int, kv_heads: int, group_pad: int):
    """The launcher's (block_q, query tiles, splits, wide) for `num_reqs` requests of
    `query_len` new rows at `seq_len` keys each (host bounds, as a graphed batch has them)."""
    import numpy as np

    from backends.runner import triton_paged_attention as tpa

    meta = tpa._one_request_meta(1, 1, 16, torch.device("cpu"), False)
    meta = dataclasses.replace(
        meta, query_start_loc_np=np.arange(num_reqs + 1, dtype=np.int32) * query_len,
        seq_lens_np=np.full(num_reqs, seq_len, np.int32))  # fmt: skip
    return tpa._launch_shape(meta, group_pad, kv_heads, torch.device("cpu"))


def test_wide_key_tiles_for_decode_batches_from_a_fifth_of_a_wave(monkeypatch) -> None:
    """On a 132-SM GPU (H200): the Thinker (32 heads over 8) reads keys 128 at a time at
    batch 4-16 and not at 1-2 or 32, the Talker (12 over 12) at 3-32; appends never; a wide
    launch caps its splits at the 128-key tiles of the bound."""
    from backends.runner import triton_paged_attention as tpa

    def wide(num_reqs: int, kv_heads: int, group_pad: int, seq_len: int = 4096, query_len: int = 1):
        return launch_shape(num_reqs, query_len, seq_len, kv_heads, group_pad)[2:]

    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)
    thinker = {b: wide(b, 8, 4)[1] for b in (1, 2, 4, 8, 16, 32)}
    assert thinker == {1: False, 2: False, 4: True, 8: True, 16: True, 32: False}
    talker = {b: wide(b, 12, 1)[1] for b in (1, 2, 3, 16, 32, 64)}
    assert talker == {1: False, 2: False, 3: True, 16: True, 32: True, 64: False}
    assert not wide(16, 8, 4, query_len=13)[1]  # an append tile
    assert wide(8, 12, 1, seq_len=256) == (2, True)  # 3 splits of 64 keys -> 2 of 128


class _Recorder:
    """Stands in for a jitted kernel: records each launch's constexpr arguments."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys, self.seen = keys, set()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.seen.add(tuple(kwargs[k] for k in self.keys))


@pytest.mark.interpreter
def test_warm_variants_compile_every_variant_a_batch_can_launch(monkeypatch) -> None:
    """The warm-up launches each (row tile, split, key tile) attention variant and each (merge
    width, padded tail) merge variant that any batch of up to 64 requests, 600 query rows and 8192
    keys would launch (the launch-shape heuristic at the Thinker's heads on a 132-SM GPU), and
    reads the caches only. The interpreted warm-up runs one kv head of the same group of 4
    (the variants depend on the group, the programs per launch on the kv heads)."""
    import triton

    from backends.runner import split_merge, triton_paged_attention as tpa

    num_heads, num_kv_heads, head_dim, page = 32, 8, 16, 4
    group = num_heads // num_kv_heads
    k_small = torch.randn(3, page, 1, head_dim)
    v_small, before = torch.randn_like(k_small), k_small.clone()
    assert tpa.warm_variants(k_small, v_small, group, blocks_per_req=5) == 30
    assert torch.equal(k_small, before)
    k_cache = torch.randn(3, page, num_kv_heads, head_dim)
    v_cache = torch.randn_like(k_cache)
    attention = _Recorder(("BLOCK_Q", "IS_SPLIT", "TILE"))
    merge = _Recorder(("SPLITS_PAD", "ZERO_TAIL"))
    monkeypatch.setattr(tpa, "_paged_attention_kernel", attention)
    monkeypatch.setattr(split_merge, "_merge_splits_kernel", merge)
    tpa.warm_variants(k_cache, v_cache, num_heads, blocks_per_req=5)
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    needed_attention, needed_merge = set(), set()
    for num_reqs in (1, 2, 3, 8, 16, 33, 64):
        for query_len in (1, 2, 13, 64, 150, 600):
            for seq_len in (query_len, 64, 300, 1000, 4096, 8192):
                block_q, _, splits, wide = launch_shape(
                    num_reqs, query_len, max(seq_len, query_len), num_kv_heads, group_pad)
                tile = tpa.WIDE_TILE_N if wide else tpa.TILE_N
                for pad_tail in (False, True):
                    split = splits > 1 or pad_tail
                    needed_attention.add((block_q, split, tile))
                    if split:
                        needed_merge.add((triton.next_power_of_2(splits), pad_tail))
    assert needed_attention <= attention.seen and len(attention.seen) == 6
    assert any(variant[2] == tpa.WIDE_TILE_N for variant in needed_attention)
    assert needed_merge <= merge.seen and len(merge.seen) == 13  # (1, padded) + 6 widths x 2
