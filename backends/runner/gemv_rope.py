"""RoPE and the paged KV write folded into the decode q|k|v GEMV as its epilogue.

A decode layer runs q|k|v = norm(x) @ W^T, then a kernel that rotates q and k (RoPE, the
rotate-half form) and writes k and v into the paged cache. On the tensor-core path a program's
output tile can be exactly one head (BLOCK_N == head_dim) for all of the step's rows, so the
GEMV can do that work itself as it stores the tile: q and k heads are rotated in float32 before
their one rounding (the separate kernel rotates the rounded bf16 values), k and v heads also
go to the cache at each row's slot (padding rows: slot < 0, not written). The q heads land in
the GEMV's output, which the attention reads through its row stride. One kernel less per layer;
taken only where `rope_epilogue_fits` holds (no q/k RMSNorm: the Talker's Llama layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from backends.runner.gemv_configs import GemvConfig


@dataclass(frozen=True, slots=True)
class RopeEpilogue:
    """What the epilogue needs besides the matmul's own arguments."""

    positions: torch.Tensor  # [M] int64
    inv_freq: torch.Tensor  # [head_dim // 2] float32
    slot_mapping: torch.Tensor  # [M] int64 flat cache row, < 0 for padding rows
    k_cache: torch.Tensor  # [num_blocks, page, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    num_heads: int

    @property
    def num_kv_heads(self) -> int:
        return self.k_cache.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k_cache.shape[3]


def rope_epilogue_fits(rope: RopeEpilogue, cfg: GemvConfig, n: int) -> bool:
    """One program per head (tensor cores, BLOCK_N = head_dim, no split-K), the q|k|v column
    order the weight has, caches laid out as the epilogue writes them."""
    width = (rope.num_heads + 2 * rope.num_kv_heads) * rope.head_dim
    caches_ok = all(c.is_contiguous() and c.dtype == rope.k_cache.dtype for c in (rope.k_cache, rope.v_cache))
    return (cfg.use_dot and cfg.split_k == 1 and cfg.block_n == rope.head_dim and n == width
            and caches_ok and rope.inv_freq.dtype == torch.float32)  # fmt: skip


@triton.jit
def _rope_kv_epilogue(acc, rm, M, head, positions_ptr, inv_freq_ptr, slot_ptr, k_cache_ptr,
                      v_cache_ptr, stride_cache_tok, NUM_HEADS: tl.constexpr,
                      NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr):  # fmt: skip
    """acc: [HEAD_DIM, BLOCK_M] float32, head `head`'s outputs (column m = row m) -> the same
    rotated for a q or k head, as is for a v head; k and v heads are written to the cache."""
    HALF: tl.constexpr = HEAD_DIM // 2
    rows = tl.minimum(rm, M - 1)
    position = tl.load(positions_ptr + rows).to(tl.float32)
    angle = tl.load(inv_freq_ptr + tl.arange(0, HALF))[:, None] * position[None, :]
    cos, sin = tl.cos(angle), tl.sin(angle)
    x1, x2 = tl.split(tl.permute(tl.reshape(acc, (2, HALF, BLOCK_M)), (1, 2, 0)))
    rotated = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)  # [HALF, BLOCK_M, 2]
    rotated = tl.reshape(tl.permute(rotated, (2, 0, 1)), (HEAD_DIM, BLOCK_M))
    is_k = (head >= NUM_HEADS) & (head < NUM_HEADS + NUM_KV_HEADS)
    is_v = head >= NUM_HEADS + NUM_KV_HEADS
    out = tl.where(is_v, acc, rotated)
    slot = tl.load(slot_ptr + rows)
    kv_head = tl.where(is_v, head - NUM_HEADS - NUM_KV_HEADS, head - NUM_HEADS)
    dst = (tl.maximum(slot, 0)[None, :] * stride_cache_tok + kv_head * HEAD_DIM
           + tl.arange(0, HEAD_DIM)[:, None])  # fmt: skip
    ok = ((rm < M) & (slot >= 0))[None, :]
    tl.store(k_cache_ptr + dst, out.to(k_cache_ptr.dtype.element_ty), mask=ok & is_k)
    tl.store(v_cache_ptr + dst, out.to(v_cache_ptr.dtype.element_ty), mask=ok & is_v)
    return out
