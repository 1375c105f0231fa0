"""Split-K GEMMs for the DiT's long-K matmuls at small batches (the CUDA path of `dit_fused`).

A window of one stream multiplies 112 rows (56 frames x conditional | unconditional). The two
causal convs (K = 1536) and fc2 (K = 2048) then run as a few dozen programs that each walk the
whole K: the latency of that loop, not bandwidth or FLOPs, sets their time
(perf/results/audio_tail_h200.md). Up to `_SPLIT_ROWS` rows the K range is cut into parts
whose float32 products land side by side in a `SplitSum`; the kernel that reads the output
next (`dit_norm_kernels`) adds the parts and the bias as it loads them, so the split costs no
extra launch and no rounding. `MINICPMO_DIT_SPLIT_K=0` keeps cuBLAS (the A/B switch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from backends.models.token2wav.dit_attention_kernel import dot_for_dtype

SPLIT_K_ENV = "MINICPMO_DIT_SPLIT_K"  # "0": never split
_SPLIT_ROWS = ((128, 4),)  # (up to rows, K parts): one stream's window (H200, see doc)
_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 32, 128


@dataclass(frozen=True, slots=True)
class SplitSum:
    """x @ w.T + b kept as float32 parts [S, rows, N] that sum (with b) to the product."""

    parts: torch.Tensor  # [S, rows, N] float32
    bias: torch.Tensor  # [N], in the layer's dtype

    @property
    def dtype(self) -> torch.dtype:
        """The layer's dtype: what the product would have been stored in."""
        return self.bias.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


@triton.jit
def _split_gemm_kernel(
    x_ptr, w_ptr, parts_ptr,  # x [M, K], w [N, K] (rows contiguous), parts [S, M, N] float32
    n_rows, n_cols, k_total, k_part, stride_x, stride_w,
    EVEN: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n, pid_m, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_low = part * k_part
    offs_k = k_low + tl.arange(0, BLOCK_K)
    row_ok, col_ok = offs_m[:, None] < n_rows, offs_n[None, :] < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(k_part, BLOCK_K)):
        ks = offs_k + k * BLOCK_K
        x_ptrs = x_ptr + offs_m[:, None] * stride_x + ks[None, :]
        w_ptrs = w_ptr + offs_n[None, :] * stride_w + ks[:, None]
        if EVEN:  # every tile whole: unmasked weight loads
            x = tl.load(x_ptrs, mask=row_ok, other=0.0)
            w = tl.load(w_ptrs)
        else:
            k_ok = (ks < k_low + k_part) & (ks < k_total)
            x = tl.load(x_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok & k_ok[:, None], other=0.0)
        acc += dot_for_dtype(x, w, IEEE, DOT_F32)  # float32 flows: as cuBLAS, not tf32
    out = parts_ptr + (part * n_rows + offs_m[:, None]) * n_cols + offs_n[None, :]
    tl.store(out, acc, mask=row_ok & col_ok)


def split_count(rows: int, k_total: int) -> int:
    """K parts for a product of `rows` rows: 1 (no split) once enough tiles fill the GPU."""
    if os.environ.get(SPLIT_K_ENV, "1") == "0":
        return 1
    for max_rows, parts in _SPLIT_ROWS:
        if rows <= max_rows:
            return max(1, min(parts, k_total // 16))
    return 1


def linear_split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 parts: int | None = None) -> torch.Tensor | SplitSum:
    """F.linear(x, weight, bias), as a SplitSum when the K range is split (see module doc).
    x [rows, K] with contiguous rows; weight [N, K] with contiguous rows; bias [N]."""
    rows, k_total = x.shape
    n_cols = weight.shape[0]
    parts = split_count(rows, k_total) if parts is None else parts
    if parts <= 1 or rows == 0:
        return F.linear(x, weight, bias)
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != k_total:
        raise ValueError(f"linear_split needs row-contiguous x {tuple(x.shape)} and weight "
                         f"{tuple(weight.shape)} of the same K")
    k_part = triton.cdiv(k_total, parts)
    block_n = min(_BLOCK_N, triton.next_power_of_2(n_cols))
    block_k = min(_BLOCK_K, triton.next_power_of_2(k_part))
    out = x.new_empty((parts, rows, n_cols), dtype=torch.float32)
    even = k_part % block_k == 0 and k_part * parts == k_total and n_cols % block_n == 0
    grid = (triton.cdiv(n_cols, block_n), triton.cdiv(rows, _BLOCK_M), parts)
    _split_gemm_kernel[grid](
        x, weight, out, rows, n_cols, k_total, k_part, x.stride(0), weight.stride(0),
        EVEN=even, IEEE=x.dtype == torch.float32, DOT_F32=not x.is_cuda,
        BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=4,
    )  # fmt: skip
    return SplitSum(out, bias)
