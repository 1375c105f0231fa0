"""The DiT's attention in one Triton kernel (the CUDA path of `dit_fused`).

In torch a DiT attention after its q|k|v GEMM is: head split and LayerNorm of q and of k,
[new | cached] key/value concatenation, the bool mask turned into an additive one, SDPA and
the head merge, about fifteen kernels. `masked_attention` does all of it from the GEMM's
rows: per (query block, row, head) it normalises its queries and, from the rows' own frames,
its keys; writes this window's keys | values (the next cache entries); and runs an online
softmax over the window's keys, then the cached ones, skipping keys the [window | cache] mask
marks as padding. Output rows come out head-merged, ready for the output projection.

While there are few programs (a batch of one to a few windows), the key tiles are split over
more programs and a second kernel merges their partial softmax states (`key_splits`):
a window's attention is latency-bound, one program walking every cached tile in turn (a
window of one stream has 64 programs for the H200's 132 SMs, ~16 us per call in
perf/profile_code2wav.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from backends.models.split_softmax import key_splits, merge_partials, softmax_step, split_target, store_partial
from backends.runner.pdl import pdl_launch_args, wait_for_inputs

_BLOCK_N = 64  # keys per step of the online softmax


@triton.jit
def _head_norm(x, weight_ptr, bias_ptr, dims, eps, HEAD_DIM: tl.constexpr):
    """LayerNorm over the last axis of [rows, HEAD_DIM], float32."""
    mean = tl.sum(x, 1) / HEAD_DIM
    centred = x - mean[:, None]
    rstd = tl.rsqrt(tl.sum(centred * centred, 1) / HEAD_DIM + eps)
    weight = tl.load(weight_ptr + dims).to(tl.float32)
    bias = tl.load(bias_ptr + dims).to(tl.float32)
    return centred * rstd[:, None] * weight[None, :] + bias[None, :]


@triton.jit
def _window_keys(qkv_ptr, row0, offs, n_frames, k_w, k_b, dims, eps, qkv_stride, head_col,
                 INNER: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Normalised keys and values [len(offs), HEAD_DIM] of window frames `offs`."""
    ok = offs < n_frames
    src = qkv_ptr + (row0 + offs)[:, None] * qkv_stride + head_col + dims[None, :]
    k = tl.load(src + INNER, mask=ok[:, None], other=0.0).to(tl.float32)
    v = tl.load(src + 2 * INNER, mask=ok[:, None], other=0.0)
    k = _head_norm(k, k_w, k_b, dims, eps, HEAD_DIM).to(v.dtype)
    return k, v, ok


@triton.jit
def _cache_keys(cache_head, order_row, valid_row, offs_c, n_frames, n_cached, s_cache_l, dims,
                dtype, INDEXED: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Cached keys and values [len(offs_c), HEAD_DIM] at cache positions `offs_c` (in cache
    order) and which of them are real keys."""
    in_cache = offs_c < n_cached
    if INDEXED:  # the cache's frames in order, wherever they sit in the pooled row
        pos = tl.load(order_row + offs_c, mask=in_cache, other=0).to(tl.int64)
    else:
        pos = offs_c
    src = cache_head + pos[:, None] * s_cache_l + dims[None, :]
    k = tl.load(src, mask=in_cache[:, None], other=0.0).to(dtype)
    v = tl.load(src + HEAD_DIM, mask=in_cache[:, None], other=0.0).to(dtype)
    ok = in_cache & (tl.load(valid_row + n_frames + offs_c, mask=in_cache, other=0) != 0)
    return k, v, ok


@triton.jit
def _attention_kernel(
    qkv_ptr,  # [R T, 3 H D] q | k | v projection rows, frame-major per row
    q_w, q_b, k_w, k_b,  # [D] q and k LayerNorm affine
    cache_ptr,  # [R, H, L, 2 D] cached keys | values (INDEXED: [pool rows, H, slots, 2 D])
    rows_ptr, order_ptr,  # INDEXED: [R] pool row of each row, [R, L] its cache's slot positions
    valid_ptr,  # [R, T + L] uint8: 1 where a key of [window | cache] is real
    out_ptr,  # [R T, H D]; SPLITS > 1: [SPLITS, R T, H, D + 2] float32 partials (acc | max | sum)
    kv_ptr,  # [R, H, T, 2 D] this window's keys | values (written)
    n_frames, n_cached, total_rows, tiles_per_split, eps, sm_scale,
    s_cache_r, s_cache_h, s_cache_l, s_valid_r, s_kv_r, s_kv_h, s_kv_t, s_order_r,
    INDEXED: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    INNER: tl.constexpr = HEADS * HEAD_DIM
    rh, split = tl.program_id(1).to(tl.int64), tl.program_id(2)
    r, h = rh // HEADS, rh % HEADS
    row0, qkv_stride, head_col = r * n_frames, 3 * INNER, h * HEAD_DIM
    dims = tl.arange(0, HEAD_DIM)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tl.load(qkv_ptr + (row0 + offs_m)[:, None] * qkv_stride + head_col + dims[None, :],
                mask=(offs_m < n_frames)[:, None], other=0.0)
    q = _head_norm(q.to(tl.float32), q_w, q_b, dims, eps, HEAD_DIM).to(q.dtype)
    if split == 0:  # this window's cache entries, once
        k_own, v_own, own = _window_keys(qkv_ptr, row0, offs_m, n_frames, k_w, k_b, dims, eps,
                                         qkv_stride, head_col, INNER, HEAD_DIM)
        dst = kv_ptr + r * s_kv_r + h * s_kv_h + offs_m[:, None] * s_kv_t + dims[None, :]
        tl.store(dst, k_own.to(kv_ptr.dtype.element_ty), mask=own[:, None])
        tl.store(dst + HEAD_DIM, v_own.to(kv_ptr.dtype.element_ty), mask=own[:, None])
    m_i, l_i = tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    valid_row = valid_ptr + r * s_valid_r
    # key tiles [window | cache]; this program takes tiles [first, last)
    window_tiles = tl.cdiv(n_frames, BLOCK_N)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, window_tiles + tl.cdiv(n_cached, BLOCK_N))
    for tile in range(first, tl.minimum(last, window_tiles)):
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        k_new, v_new, in_window = _window_keys(qkv_ptr, row0, offs_n, n_frames, k_w, k_b, dims,
                                               eps, qkv_stride, head_col, INNER, HEAD_DIM)
        use = in_window & (tl.load(valid_row + offs_n, mask=in_window, other=0) != 0)
        m_i, l_i, acc = softmax_step(q, k_new, v_new, use, m_i, l_i, acc, sm_scale, IEEE,
                                     DOT_F32)
    cache_row = tl.load(rows_ptr + r).to(tl.int64) if INDEXED else r
    cache_head = cache_ptr + cache_row * s_cache_r + h * s_cache_h
    for tile_c in range(tl.maximum(first, window_tiles), last):
        offs_c = (tile_c - window_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_old, v_old, cached_ok = _cache_keys(cache_head, order_ptr + r * s_order_r, valid_row,
                                              offs_c, n_frames, n_cached, s_cache_l, dims, q.dtype,
                                              INDEXED, HEAD_DIM)  # fmt: skip
        m_i, l_i, acc = softmax_step(q, k_old, v_old, cached_ok, m_i, l_i, acc, sm_scale, IEEE,
                                     DOT_F32)
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + (row0 + offs_m)[:, None] * INNER + head_col + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(offs_m < n_frames)[:, None])
    else:
        store_partial(out_ptr, acc, m_i, l_i, (split * total_rows + row0 + offs_m) * HEADS + h,
                      offs_m < n_frames, dims, HEAD_DIM)


def _block_m(programs: int, n_frames: int) -> int:
    """Small query blocks while there are few (row, head) programs: more of the GPU busy."""
    return 16 if programs < 512 or n_frames <= 16 else 32


def _cache_index(cache: torch.Tensor, index: tuple[torch.Tensor, torch.Tensor] | None,
                 rows_b: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (pool rows, slot order, cached keys per row); without an index the rows and order
    pointers are unused placeholders."""
    if index is None:
        return cache, cache, cache.shape[2]
    rows, order = index
    if rows.shape != (rows_b,) or order.shape[0] != rows_b or order.stride(1) != 1:
        raise ValueError(f"cache index {tuple(rows.shape)}, {tuple(order.shape)} for {rows_b} rows")
    return rows, order, order.shape[1]


def masked_attention(
    qkv: torch.Tensor,  # [R T, 3 H D] q | k | v rows
    q_norm: torch.nn.LayerNorm,  # over D
    k_norm: torch.nn.LayerNorm,
    cache: torch.Tensor,  # [R, H, L, 2 D] (last axis contiguous)
    key_valid: torch.Tensor,  # [R, T + L] bool over [window | cache]
    new_kv: torch.Tensor,  # [R, H, T, 2 D] written: this window's keys | values
    index: tuple[torch.Tensor, torch.Tensor] | None = None,  # pooled cache: rows [R], order [R, L]
    splits: int | None = None,  # key splits (None: `key_splits`); tests pick them
) -> torch.Tensor:
    """-> attention output [R T, H D] (SDPA's default scale 1 / sqrt(D)). With `index`,
    `cache` is a pool [rows, H, slots, 2 D] and row r's cache is its pool row rows[r] read at
    slots order[r] (in that order; key_valid's cache part then covers order's columns)."""
    rows_b, heads, n_frames, two_d = new_kv.shape
    head_dim = two_d // 2
    if qkv.shape != (rows_b * n_frames, 3 * heads * head_dim) or qkv.stride(1) != 1:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not match new_kv {tuple(new_kv.shape)}")
    if cache.stride(3) != 1 or new_kv.stride(3) != 1 or key_valid.stride(1) != 1:
        raise ValueError("cache, new_kv and key_valid need a contiguous last axis")
    out = qkv.new_empty(rows_b * n_frames, heads * head_dim)
    block_m = _block_m(rows_b * heads, n_frames)
    if q_norm.eps != k_norm.eps:
        raise ValueError(f"q and k norms differ in eps: {q_norm.eps} vs {k_norm.eps}")
    rows, order, n_cached = _cache_index(cache, index, rows_b)
    q_blocks = triton.cdiv(n_frames, block_m)
    key_tiles = triton.cdiv(n_frames, _BLOCK_N) + triton.cdiv(n_cached, _BLOCK_N)
    splits = key_splits(q_blocks * rows_b * heads, key_tiles) if splits is None else splits
    total_rows = rows_b * n_frames
    target = split_target(out, splits, total_rows, heads, head_dim)
    _attention_kernel[(q_blocks, rows_b * heads, splits)](
        qkv, q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias, cache, rows, order,
        key_valid.view(torch.uint8), target, new_kv, n_frames, n_cached, total_rows,
        triton.cdiv(key_tiles, splits), q_norm.eps, 1.0 / math.sqrt(head_dim), *cache.stride()[:3],
        key_valid.stride(0), *new_kv.stride()[:3], order.stride(0), INDEXED=index is not None,
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=_BLOCK_N, SPLITS=splits,
        IEEE=qkv.dtype == torch.float32, DOT_F32=not qkv.is_cuda, num_warps=4,
        **pdl_launch_args(qkv.device),
    )  # fmt: skip
    merge_partials(target, out, pdl_launch_args(qkv.device))
    return out
