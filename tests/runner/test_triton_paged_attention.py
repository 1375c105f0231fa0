"""Triton paged attention vs the reference backend (Triton's interpreter on CPU, float32).

Strategy: reuse the attention tests' case builder (random K/V in a shuffled page pool, block
size 4) and compare the kernel with `paged_attention_reference` on decodes, fresh prefills and
chunks with cached context, with one split (direct store) and forced splits (the merge
kernel), for GQA groups of 1, 2 and 4. Skipped where Triton is not installed.
"""

from __future__ import annotations

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
