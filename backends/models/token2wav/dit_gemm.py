"""The DiT's GEMMs at small batches as Triton kernels (the CUDA path of `dit_fused`).

A window of one stream multiplies 112 rows (56 frames x conditional | unconditional), so each
of a block's six GEMMs is a few dozen programs whose time is the latency of their K loop, not
bandwidth or FLOPs (perf/results/stages_h200.md). Two things shorten it here:

- split-K: the two causal convs (K = 1536), fc2 (K = 2048) and the output projection cut their
  K range into parts whose float32 products land side by side in a `SplitSum`; the kernel that
  reads the output next (`dit_norm_kernels`) adds the parts and the bias as it loads them, so
  the split costs no extra launch and no rounding (`_SPLIT_ROWS`: only while few rows);
- one chain: up to `_CHAIN_ROWS` rows on a GPU with programmatic dependent launch
  (`backends/runner/pdl.py`), q|k|v and fc1 (tanh-GELU epilogue) run as the same kernel
  instead of cuBLAS, so every kernel of a block is launched with PDL: its programs are resident
  during the previous kernel's tail and wait for it before their first load. A cuBLAS call in
  the chain would break it (an earlier PDL trial, which had them, gained nothing). Without PDL
  (GPUs older than Hopper) these two stay cuBLAS. (An L2 prefetch of the weights before the
  wait, as the runner's GEMV does, measured within noise here and was left out.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from backends.models.split_softmax import dot_for_dtype
from backends.runner.pdl import pdl_launch_args, use_pdl, wait_for_inputs

_SPLIT_ROWS = ((128, 4),)  # (up to rows, K parts): one stream's window (H200, see doc)
_CHAIN_ROWS = 224  # Triton (not cuBLAS) GEMMs up to this many rows (two streams) under PDL
_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 32, 128
_SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)  # jit reads constexpr globals only


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
def _gemm_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,  # x [M, K], w [N, K] (rows contiguous), bias [N]
    n_rows, n_cols, k_total, k_part, stride_x, stride_w,
    SPLIT: tl.constexpr,  # out: [S, M, N] float32 parts, no bias; else [M, N] with bias
    GELU: tl.constexpr, EVEN: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n, pid_m, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_low = part * k_part
    k_high = tl.minimum(k_low + k_part, k_total)
    wait_for_inputs(PDL)
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
            k_ok = ks < k_high
            x = tl.load(x_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok & k_ok[:, None], other=0.0)
        acc += dot_for_dtype(x, w, IEEE, DOT_F32)  # float32 flows: as cuBLAS, not tf32
    if SPLIT:
        out = out_ptr + (part * n_rows + offs_m[:, None]) * n_cols + offs_n[None, :]
        tl.store(out, acc, mask=row_ok & col_ok)
    else:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < n_cols, other=0.0).to(tl.float32)[None, :]
        if GELU:  # tanh form, as cuBLASLt's GELU epilogue and F.gelu(approximate="tanh")
            inner = _SQRT_2_OVER_PI * (acc + 0.044715 * acc * acc * acc)
            acc = 0.5 * acc * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
        out = out_ptr + offs_m[:, None] * n_cols + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok & col_ok)


def split_count(rows: int, k_total: int) -> int:
    """K parts for a product of `rows` rows: 1 (no split) once enough tiles fill the GPU."""
    for max_rows, parts in _SPLIT_ROWS:
        if rows <= max_rows:
            return max(1, min(parts, k_total // 16))
    return 1


def chained(x: torch.Tensor) -> bool:
    """Whether a product of x's rows runs as the Triton kernel under PDL (see module doc)."""
    return 0 < x.shape[0] <= _CHAIN_ROWS and use_pdl(x.device)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool = False,
           triton_kernel: bool | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), then tanh-GELU with `gelu`. `triton_kernel` (None: `chained`)
    picks the Triton kernel over cuBLAS (tests force it, to run the kernel in the interpreter)."""
    use_triton = chained(x) if triton_kernel is None else triton_kernel
    if not use_triton or x.shape[0] == 0:
        if not gelu:
            return F.linear(x, weight, bias)
        if x.is_cuda:  # one GEMM with cuBLASLt's GELU epilogue (tanh form); CPU's is erf
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        return F.gelu(F.linear(x, weight, bias), approximate="tanh")
    out = x.new_empty((x.shape[0], weight.shape[0]))
    _launch(x, weight, bias, out, 1, gelu)
    return out


def linear_split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 parts: int | None = None) -> torch.Tensor | SplitSum:
    """F.linear(x, weight, bias), as a SplitSum when the K range is split (see module doc).
    x [rows, K] with contiguous rows; weight [N, K] with contiguous rows; bias [N]."""
    rows, k_total = x.shape
    parts = split_count(rows, k_total) if parts is None else parts
    if parts <= 1 or rows == 0:
        return linear(x, weight, bias)
    out = x.new_empty((parts, rows, weight.shape[0]), dtype=torch.float32)
    _launch(x, weight, bias, out, parts, False)
    return SplitSum(out, bias)


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor,
            parts: int, gelu: bool) -> None:
    rows, k_total = x.shape
    n_cols = weight.shape[0]
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != k_total:
        raise ValueError(f"the DiT GEMM needs row-contiguous x {tuple(x.shape)} and weight "
                         f"{tuple(weight.shape)} of the same K")
    k_part = triton.cdiv(k_total, parts)
    block_n = min(_BLOCK_N, triton.next_power_of_2(n_cols))
    block_k = min(_BLOCK_K, triton.next_power_of_2(k_part))
    even = k_part % block_k == 0 and k_part * parts == k_total and n_cols % block_n == 0
    grid = (triton.cdiv(n_cols, block_n), triton.cdiv(rows, _BLOCK_M), parts)
    _gemm_kernel[grid](
        x, weight, bias, out, rows, n_cols, k_total, k_part, x.stride(0), weight.stride(0),
        SPLIT=parts > 1, GELU=gelu, EVEN=even, IEEE=x.dtype == torch.float32,
        DOT_F32=not x.is_cuda, BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
        num_stages=4, **pdl_launch_args(x.device),
    )  # fmt: skip
