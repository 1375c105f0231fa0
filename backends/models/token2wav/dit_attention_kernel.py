"""The DiT's attention in one Triton kernel (the CUDA path of `dit_fused`).

In torch a DiT attention after its q|k|v GEMM is: head split and LayerNorm of q and of k,
[new | cached] key/value concatenation, the bool mask turned into an additive one, SDPA and
the head merge, about fifteen kernels. `masked_attention` does all of it from the GEMM's
rows: per (query block, row, head) it normalises its queries and, from the rows' own frames,
its keys; writes this window's keys | values (the next cache entries); and runs an online
softmax over the window's keys, then the cached ones, skipping keys the [window | cache] mask
marks as padding. Output rows come out head-merged, ready for the output projection.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

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
def _dot(a, b, IEEE: tl.constexpr, DOT_F32: tl.constexpr):
    """IEEE: full float32 products (float32 flows; tf32 would miss their parity bound)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _softmax_step(q, k, v, ok, m_i, l_i, acc, sm_scale, IEEE: tl.constexpr,
                  DOT_F32: tl.constexpr):
    """One block of keys into the running max m_i, sum l_i and output acc (float32).
    DOT_F32: dot products of float32 copies (exact for bfloat16 inputs), for Triton's
    interpreter, whose bfloat16 `tl.dot` gives garbage."""
    s = _dot(q, tl.trans(k), IEEE, DOT_F32) * sm_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing unmasked yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, DOT_F32)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


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
def _attention_kernel(
    qkv_ptr,  # [R T, 3 H D] q | k | v projection rows, frame-major per row
    q_w, q_b, k_w, k_b,  # [D] q and k LayerNorm affine
    cache_ptr,  # [R, H, L, 2 D] cached keys | values (INDEXED: [pool rows, H, slots, 2 D])
    rows_ptr, order_ptr,  # INDEXED: [R] pool row of each row, [R, L] its cache's slot positions
    valid_ptr,  # [R, T + L] uint8: 1 where a key of [window | cache] is real
    out_ptr,  # [R T, H D]
    kv_ptr,  # [R, H, T, 2 D] this window's keys | values (written)
    n_frames, n_cached, eps, sm_scale,
    s_cache_r, s_cache_h, s_cache_l, s_valid_r, s_kv_r, s_kv_h, s_kv_t, s_order_r,
    INDEXED: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
):
    INNER: tl.constexpr = HEADS * HEAD_DIM
    rh = tl.program_id(1).to(tl.int64)
    r, h = rh // HEADS, rh % HEADS
    row0, qkv_stride, head_col = r * n_frames, 3 * INNER, h * HEAD_DIM
    dims = tl.arange(0, HEAD_DIM)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tl.load(qkv_ptr + (row0 + offs_m)[:, None] * qkv_stride + head_col + dims[None, :],
                mask=(offs_m < n_frames)[:, None], other=0.0)
    q = _head_norm(q.to(tl.float32), q_w, q_b, dims, eps, HEAD_DIM).to(q.dtype)
    # distinct names per loop: compiled Triton carries a reused name through a loop, and the
    # block shapes differ
    k_own, v_own, own = _window_keys(qkv_ptr, row0, offs_m, n_frames, k_w, k_b, dims, eps,
                                     qkv_stride, head_col, INNER, HEAD_DIM)
    dst = kv_ptr + r * s_kv_r + h * s_kv_h + offs_m[:, None] * s_kv_t + dims[None, :]
    tl.store(dst, k_own.to(kv_ptr.dtype.element_ty), mask=own[:, None])
    tl.store(dst + HEAD_DIM, v_own.to(kv_ptr.dtype.element_ty), mask=own[:, None])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    valid_row = valid_ptr + r * s_valid_r
    for start in range(0, n_frames, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k_new, v_new, in_window = _window_keys(qkv_ptr, row0, offs_n, n_frames, k_w, k_b, dims,
                                               eps, qkv_stride, head_col, INNER, HEAD_DIM)
        use = in_window & (tl.load(valid_row + offs_n, mask=in_window, other=0) != 0)
        m_i, l_i, acc = _softmax_step(q, k_new, v_new, use, m_i, l_i, acc, sm_scale, IEEE,
                                      DOT_F32)
    cache_row = r
    if INDEXED:
        cache_row = tl.load(rows_ptr + r).to(tl.int64)
    cache_head = cache_ptr + cache_row * s_cache_r + h * s_cache_h
    for start_c in range(0, n_cached, BLOCK_N):
        offs_c = start_c + tl.arange(0, BLOCK_N)
        in_cache = offs_c < n_cached
        if INDEXED:  # the cache's frames in order, wherever they sit in the pooled row
            pos = tl.load(order_ptr + r * s_order_r + offs_c, mask=in_cache, other=0).to(tl.int64)
        else:
            pos = offs_c
        src = cache_head + pos[:, None] * s_cache_l + dims[None, :]
        k_old = tl.load(src, mask=in_cache[:, None], other=0.0).to(q.dtype)
        v_old = tl.load(src + HEAD_DIM, mask=in_cache[:, None], other=0.0).to(q.dtype)
        cached_ok = in_cache & (tl.load(valid_row + n_frames + offs_c, mask=in_cache, other=0) != 0)
        m_i, l_i, acc = _softmax_step(q, k_old, v_old, cached_ok, m_i, l_i, acc, sm_scale, IEEE,
                                      DOT_F32)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (row0 + offs_m)[:, None] * INNER + head_col + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(offs_m < n_frames)[:, None])


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
    grid = (triton.cdiv(n_frames, block_m), rows_b * heads)
    rows, order, n_cached = _cache_index(cache, index, rows_b)
    _attention_kernel[grid](
        qkv, q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias, cache, rows, order,
        key_valid.view(torch.uint8), out, new_kv, n_frames, n_cached, q_norm.eps,
        1.0 / math.sqrt(head_dim), *cache.stride()[:3], key_valid.stride(0),
        *new_kv.stride()[:3], order.stride(0), INDEXED=index is not None, HEADS=heads,
        HEAD_DIM=head_dim, BLOCK_M=block_m,
        BLOCK_N=_BLOCK_N, IEEE=qkv.dtype == torch.float32, DOT_F32=not qkv.is_cuda, num_warps=4,
    )  # fmt: skip
    return out
