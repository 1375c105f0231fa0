"""How the skinny decode GEMM (`triton_gemv`) reads its input rows: plain, or through a
`Prologue` that folds the elementwise kernel before the matmul into its loads.

Prologues (kinds in `gemv_configs`): RMSNorm, after an optional residual add whose sum the
first column block writes out, as rsqrt(mean(x^2) + eps) * ((x * w) @ W^T) with the row's sum
of squares gathered along the K loop; or SwiGLU, silu(x[:, :K]) * x[:, K:]. Each path (FMA rows
on the CUDA cores, `tl.dot` rows on the tensor cores) calls `_input_tile` for its tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from backends.runner.gemv_configs import ADD_NORM, NORM, PLAIN


@dataclass(frozen=True, slots=True)
class Prologue:
    """The elementwise op folded into a matmul's input loads (`kind`, one of the constants
    above); the tensors are [M, K] contiguous like x, the norm weight [K]."""

    kind: int = PLAIN
    norm_weight: torch.Tensor | None = None
    eps: float = 0.0
    residual: torch.Tensor | None = None  # ADD_NORM: added to x before the norm
    residual_out: torch.Tensor | None = None  # ADD_NORM: receives the rounded x + residual

    @property
    def is_norm(self) -> bool:
        return self.kind in (NORM, ADD_NORM)


@triton.jit
def _input_tile(x_ptr, res_ptr, nw_ptr, res_out_ptr, row_offs, cols, mask, K, write,
                PROLOGUE: tl.constexpr):  # fmt: skip
    """The matmul input at row_offs + cols after the prologue, in float32, and its squares
    (the RMSNorm's, zeros when there is none). `write` masks the residual sum's store."""
    if PROLOGUE == 3:
        gate = tl.load(x_ptr + row_offs + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row_offs + K + cols, mask=mask, other=0.0).to(tl.float32)
        x = gate * tl.sigmoid(gate) * up
        squares = tl.zeros_like(x)
    else:
        raw = tl.load(x_ptr + row_offs + cols, mask=mask, other=0.0)
        if PROLOGUE == 2:  # the residual stream, rounded as the unfused add rounds it
            res = tl.load(res_ptr + row_offs + cols, mask=mask, other=0.0)
            raw = (raw.to(tl.float32) + res.to(tl.float32)).to(res.dtype)
            tl.store(res_out_ptr + row_offs + cols, raw, mask=mask & write)
        summed = raw.to(tl.float32)
        squares = summed * summed
        x = summed * tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return x, squares


@triton.jit
def _fma_rows(acc, sq_sum, w, x_ptr, res_ptr, nw_ptr, res_out_ptr, cols, k_mask, M, K,
              stride_xm, write, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr,
              PROLOGUE: tl.constexpr):  # fmt: skip
    """acc[:, m] += w @ x[m, cols] for each row m, on the CUDA cores: the weight tile
    [BLOCK_N, BLOCK_K] stays in registers; sq_sum[m] gathers the prologue's squares."""
    w = w.to(tl.float32)
    rm = tl.arange(0, BLOCK_M)
    for m in tl.static_range(BLOCK_M):
        row_offs = tl.minimum(m, M - 1) * stride_xm
        if PROLOGUE == 0:
            if EVEN_K:
                x_m = tl.load(x_ptr + row_offs + cols).to(tl.float32)
            else:
                x_m = tl.load(x_ptr + row_offs + cols, mask=k_mask, other=0.0).to(tl.float32)
        else:
            x_m, squares = _input_tile(x_ptr, res_ptr, nw_ptr, res_out_ptr, row_offs, cols,
                                       k_mask, K, write & (m < M), PROLOGUE)  # fmt: skip
            sq_sum += tl.where(rm == m, tl.sum(squares, 0), 0.0)
        col = tl.sum(w * x_m[None, :], axis=1)
        acc += tl.where(rm[None, :] == m, col[:, None], 0.0)
    return acc, sq_sum


@triton.jit
def _dot_rows(acc, sq_sum, w, x_ptrs, x_ptr, res_ptr, nw_ptr, res_out_ptr, cols, k_mask, rm,
              rm_load, M, K, stride_xm, write, EVEN_K: tl.constexpr,
              PROLOGUE: tl.constexpr):  # fmt: skip
    """acc += w @ x[rows, cols]^T on the tensor cores (rows padded to BLOCK_M by clamping);
    sq_sum gathers the prologue's squares per row."""
    if PROLOGUE != 0:
        row_offs = rm_load[:, None] * stride_xm
        row_write = write & (rm < M)[:, None]
        x, squares = _input_tile(x_ptr, res_ptr, nw_ptr, res_out_ptr, row_offs, cols[None, :],
                                 k_mask[None, :], K, row_write, PROLOGUE)  # fmt: skip
        sq_sum += tl.sum(squares, 1)
        x = x.to(w.dtype)
    elif EVEN_K:
        x = tl.load(x_ptrs)
    else:
        x = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
    return acc + tl.dot(w, tl.trans(x), out_dtype=tl.float32), sq_sum
