"""Fused elementwise kernels of a decoder layer, in Triton, for the fast path.

A decode step of a small batch is launch-bound outside the matmuls: RMSNorm, q/k norm, RoPE,
the KV write and SwiGLU are about 40 tiny torch kernels per layer. These four kernels do the
same math in float32 registers with one rounding to the model dtype per output:

- `rms_norm`: y = rmsnorm(x) * w; with a residual, x is first replaced by the rounded x + r
  and that sum is returned too (the pre-norm residual stream).
- `qk_norm_rope_store_kv`: from the fused q|k|v projection rows, per-head RMSNorm of q and k
  (Qwen3; optional), rotate-half RoPE from the positions, q written out, k and v written to
  their pages at `slot_mapping` (negative slots are padding rows and write nothing).
- `silu_and_mul`: silu(gate) * up from the fused gate|up projection rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.runner.pdl import pdl_launch_args, wait_for_inputs


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [rows, n] input (the new branch output when HAS_RESIDUAL)
    residual_ptr,  # [rows, n] residual stream in, when HAS_RESIDUAL
    weight_ptr,  # [n]
    out_ptr,  # [rows, n] normalised output
    residual_out_ptr,  # [rows, n] x + residual, when HAS_RESIDUAL
    eps,
    n_cols,
    stride_x,
    stride_r,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        summed = (x + res.to(tl.float32)).to(res.dtype)
        tl.store(residual_out_ptr + row * n_cols + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * weight
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [rows, n] (row stride free, columns contiguous); weight: [n] ->
    (normalised [rows, n], residual stream [rows, n]: x + residual, or x itself)."""
    rows, n_cols = x.shape
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else x
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, summed, eps, n_cols,
        x.stride(0), (residual if residual is not None else x).stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n_cols),
        num_warps=_warps(n_cols), **pdl_launch_args(x.device),
    )  # fmt: skip
    return out, summed


def _warps(n_cols: int) -> int:
    return max(1, min(16, triton.next_power_of_2(n_cols) // 256))


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
    positions_ptr,  # [num_tokens] int64
    slot_mapping_ptr,  # [num_tokens] int64, < 0 for padding rows
    inv_freq_ptr,  # [head_dim // 2] float32
    q_norm_ptr,  # [head_dim] q RMSNorm weight (unused without HAS_QK_NORM)
    k_norm_ptr,  # [head_dim]
    q_out_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks * page, num_kv_heads, head_dim]
    v_cache_ptr,
    eps,
    stride_qkv,
    stride_cache_tok,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # q heads first, then kv heads (the q|k column order)
    is_q = head < NUM_HEADS
    kv_head = tl.maximum(head - NUM_HEADS, 0)
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    src = qkv_ptr + tok * stride_qkv + head * HEAD_DIM
    x1 = tl.load(src + offs).to(tl.float32)
    x2 = tl.load(src + HALF + offs).to(tl.float32)
    if HAS_QK_NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / HEAD_DIM + eps)
        w1 = tl.where(is_q, tl.load(q_norm_ptr + offs), tl.load(k_norm_ptr + offs))
        w2 = tl.where(is_q, tl.load(q_norm_ptr + HALF + offs), tl.load(k_norm_ptr + HALF + offs))
        x1 = x1 * rstd * w1.to(tl.float32)
        x2 = x2 * rstd * w2.to(tl.float32)
    angle = tl.load(positions_ptr + tok).to(tl.float32) * tl.load(inv_freq_ptr + offs)
    cos, sin = tl.cos(angle), tl.sin(angle)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    q_dst = q_out_ptr + (tok * NUM_HEADS + head) * HEAD_DIM
    q_mask = (offs < HALF) & is_q
    tl.store(q_dst + offs, y1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_dst + HALF + offs, y2.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    slot = tl.load(slot_mapping_ptr + tok)
    kv_mask = (offs < HALF) & (head >= NUM_HEADS) & (slot >= 0)
    dst = tl.maximum(slot, 0) * stride_cache_tok + kv_head * HEAD_DIM
    tl.store(k_cache_ptr + dst + offs, y1.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(k_cache_ptr + dst + HALF + offs, y2.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
    v_src = qkv_ptr + tok * stride_qkv + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM
    v1 = tl.load(v_src + offs, mask=kv_mask, other=0.0)
    v2 = tl.load(v_src + HALF + offs, mask=kv_mask, other=0.0)
    tl.store(v_cache_ptr + dst + offs, v1.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(v_cache_ptr + dst + HALF + offs, v2.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)


def qk_norm_rope_store_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    inv_freq: torch.Tensor,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """qkv: [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim] fused projection rows;
    positions, slot_mapping: [num_tokens] int64; inv_freq: [head_dim // 2] float32;
    qk_norm: (q weight [head_dim], k weight [head_dim], eps) or None; k_cache/v_cache:
    [num_blocks, page, num_kv_heads, head_dim] written in place -> q [num_tokens, heads, dim]."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    num_tokens = qkv.shape[0]
    query = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    q_weight, k_weight, eps = qk_norm if qk_norm is not None else (inv_freq, inv_freq, 0.0)
    _qk_norm_rope_kernel[(num_tokens, num_heads + num_kv_heads)](
        qkv, positions, slot_mapping, inv_freq, q_weight, k_weight, query, k_cache, v_cache,
        eps, qkv.stride(0), k_cache.stride(1),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HAS_QK_NORM=qk_norm is not None, num_warps=1, **pdl_launch_args(qkv.device),
    )  # fmt: skip
    return query


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,  # [rows, 2 * n] gate columns then up columns
    out_ptr,  # [rows, n]
    n_cols,
    stride_in,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + n_cols + cols, mask=mask, other=0.0)
    y = gate * tl.sigmoid(gate) * up.to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [rows, 2 * n] -> [rows, n] silu(gate) * up."""
    rows, width = gate_up.shape
    n_cols = width // 2
    out = torch.empty(rows, n_cols, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_and_mul_kernel[(rows, triton.cdiv(n_cols, block))](
        gate_up, out, n_cols, gate_up.stride(0), BLOCK=block, num_warps=4,
        **pdl_launch_args(gate_up.device),
    )
    return out
