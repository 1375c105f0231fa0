"""The streaming audio encoder's chunk attention as a Triton kernel with the keys split over
programs (served by `ChunkEncoderGraphs` on CUDA; on the CPU it uses torch's SDPA).

A graphed chunk pass attends 50 queries of each of 1-4 sessions over a key bucket (64 ... 1500
frames) of the working cache, masked past each session's end. Torch's fused kernel runs one
program per (row, head, query block), each walking every key in turn: 16 programs for one session
on a GPU of 132 SMs, ~95 us a layer at 1024-1500 keys on an H100. Here the key tiles of a row are
split over more programs and a second kernel merges their softmax states (split_softmax.py, shared
with the vocoder's DiT attention). Each row's end comes from a device tensor (`KeyEnds`,
backends/models/encoder_kv.py), so one captured graph serves every end inside its bucket, and
tiles past a row's end are skipped. On an H100 the whole encoder pass of one session over 1400
held frames takes 1.81 ms with this kernel against 4.00 with torch's
(perf/results/thinker_h100.md).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from backends.models.split_softmax import (
    key_splits,
    merge_partials,
    softmax_step,
    split_target,
    store_partial,
)

_BLOCK_M = 16  # queries a program: a chunk's 50 in four blocks, more programs for one session
_BLOCK_N = 64  # keys a step of the online softmax


@triton.jit
def _chunk_attention_kernel(
    q_ptr, k_ptr, v_ptr,  # [R, H, T, D] queries; [R, H, >= keys, D] keys and values
    ends_ptr,  # [R] int32: row r attends to keys [0, ends[r])
    out_ptr,  # [R T, H D]; SPLITS > 1: [SPLITS, R T, H, D + 2] float32 partials (acc | max | sum)
    n_frames, total_rows, tiles_per_split, sm_scale,
    s_q_r, s_q_h, s_q_t, s_k_r, s_k_h, s_k_l, s_v_r, s_v_h, s_v_l,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
):
    rh, split = tl.program_id(1).to(tl.int64), tl.program_id(2)
    r, h = rh // HEADS, rh % HEADS
    dims = tl.arange(0, HEAD_DIM)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = offs_m < n_frames
    q = tl.load(q_ptr + r * s_q_r + h * s_q_h + offs_m[:, None] * s_q_t + dims[None, :],
                mask=rows_ok[:, None], other=0.0)
    end = tl.load(ends_ptr + r)
    m_i, l_i = tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first = split * tiles_per_split
    for tile in range(first, tl.minimum(first + tiles_per_split, tl.cdiv(end, BLOCK_N))):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = offs_n < end
        k = tl.load(k_ptr + r * s_k_r + h * s_k_h + offs_n[:, None] * s_k_l + dims[None, :],
                    mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + r * s_v_r + h * s_v_h + offs_n[:, None] * s_v_l + dims[None, :],
                    mask=ok[:, None], other=0.0)
        m_i, l_i, acc = softmax_step(q, k, v, ok, m_i, l_i, acc, sm_scale, IEEE, DOT_F32)
    row0 = r * n_frames
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + ((row0 + offs_m)[:, None] * HEADS + h) * HEAD_DIM + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=rows_ok[:, None])
    else:
        store_partial(out_ptr, acc, m_i, l_i, (split * total_rows + row0 + offs_m) * HEADS + h,
                      rows_ok, dims, HEAD_DIM)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    ends: torch.Tensor) -> torch.Tensor:
    """q [R, H, T, D], k and v [R, H, keys, D] (any strides, last axis contiguous), ends [R]
    int32 (each <= keys, >= 1) -> SDPA's output with keys >= ends[r] masked, heads merged:
    [R, T, H D]. Needs CUDA, or Triton's interpreter for CPU tensors."""
    rows, heads, n_frames, head_dim = q.shape
    if k.shape[:2] != (rows, heads) or v.shape != k.shape or k.shape[3] != head_dim:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} differ")
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("q, k and v need a contiguous last axis")
    if ends.shape != (rows,) or ends.dtype != torch.int32:
        raise ValueError(f"ends must be [{rows}] int32, got {tuple(ends.shape)} {ends.dtype}")
    out = q.new_empty(rows * n_frames, heads * head_dim)
    q_blocks = triton.cdiv(n_frames, _BLOCK_M)
    key_tiles = triton.cdiv(k.shape[2], _BLOCK_N)
    splits = key_splits(q_blocks * rows * heads, key_tiles)
    total_rows = rows * n_frames
    target = split_target(out, splits, total_rows, heads, head_dim)
    _chunk_attention_kernel[(q_blocks, rows * heads, splits)](
        q, k, v, ends, target, n_frames, total_rows, triton.cdiv(key_tiles, splits),
        1.0 / math.sqrt(head_dim), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, SPLITS=splits,
        IEEE=q.dtype == torch.float32, DOT_F32=not q.is_cuda, num_warps=4,
    )  # fmt: skip
    merge_partials(target, out, {"PDL": False})  # the encoder's graphs launch without PDL
    return out.view(rows, n_frames, heads * head_dim)
