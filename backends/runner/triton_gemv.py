"""Skinny GEMM for decode: y = x @ W^T (+ b) for at most 16 rows of x, streaming W once.

A decode step multiplies a handful of activation rows by every weight matrix of the model, so
its matmuls are bound by reading the weights. `skinny_linear` reads each bf16/fp16 weight
row-major ([N, K], as `nn.Linear` stores it) exactly once: program (n, s) owns the BLOCK_N
output columns n and the s-th of SPLIT_K slices of K, loops over that slice in BLOCK_K steps
with wide loads, and accumulates in float32, either on the tensor cores (`tl.dot` of the weight
tile against the rows padded to 16) or row by row with FMAs and a reduction over K (the tile
stays in registers). With SPLIT_K > 1 the float32 partial sums go to a workspace and one small
kernel adds them (and the bias). Rows and columns past M and N are clamped, not masked, on
load, so the hot loop's loads stay unmasked (K is masked only when no block divides it).

Configurations come from `CONFIGS`, keyed by (row bucket, N, K) (the Thinker's shapes, filled
from `perf/bench_gemv.py --sweep` on an H200), else from `heuristic_config`. Nothing syncs with
the host and outputs come from torch's caching allocator, so it runs inside CUDA graph capture.
Anything else (more rows, CPU tensors, other dtypes, autograd) falls back to `F.linear`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16
GEMV_BACKENDS = ("cublas", "triton")
LinearFn = Callable[..., torch.Tensor]  # (x, weight, bias=None) -> y, like F.linear


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = False  # tensor-core tl.dot over rows padded to 16, else FMA + reduce


# (row bucket, N, K) -> config; None: cuBLAS was faster, so skinny_linear calls F.linear. From
# `perf/bench_gemv.py --sweep` on an H200 (torch 2.11, Triton 3.6): FMA wins at 1-2 rows.
_FMA_N4 = GemvConfig(4, 1024, 1, 4, 1, False)
_FMA_N2 = GemvConfig(2, 2048, 1, 4, 1, False)
_FMA_N2_ST3 = GemvConfig(2, 2048, 1, 4, 3, False)
_DOT_N64 = GemvConfig(64, 256, 1, 4, 3, True)
_DOT_N64_S2 = GemvConfig(64, 256, 2, 4, 3, True)
_DOT_N64_S4 = GemvConfig(64, 128, 4, 4, 4, True)
_DOT_N128 = GemvConfig(128, 128, 1, 4, 3, True)
CONFIGS: dict[tuple[int, int, int], GemvConfig | None] = {
    (1, 6144, 4096): _FMA_N2,
    (1, 4096, 4096): _FMA_N4,
    (1, 24576, 4096): _FMA_N2_ST3,
    (1, 4096, 12288): _FMA_N4,
    (1, 151936, 4096): GemvConfig(16, 512, 1, 4, 3, False),
    (2, 6144, 4096): None,
    (2, 4096, 4096): _FMA_N2,
    (2, 24576, 4096): None,
    (2, 4096, 12288): _FMA_N2_ST3,
    (2, 151936, 4096): _DOT_N128,
    (4, 6144, 4096): None,
    (4, 4096, 4096): GemvConfig(128, 128, 4, 4, 3, True),
    (4, 24576, 4096): None,
    (4, 4096, 12288): _DOT_N64_S4,
    (4, 151936, 4096): _DOT_N128,
    (8, 6144, 4096): _DOT_N64,
    (8, 4096, 4096): _DOT_N64_S2,
    (8, 24576, 4096): _DOT_N128,
    (8, 4096, 12288): _DOT_N64_S4,
    (8, 151936, 4096): _DOT_N128,
    (16, 6144, 4096): _DOT_N64,
    (16, 4096, 4096): GemvConfig(64, 128, 2, 4, 4, True),
    (16, 24576, 4096): _DOT_N128,
    (16, 4096, 12288): _DOT_N64_S2,
    (16, 151936, 4096): _DOT_N128,
}


@triton.jit
def _fma_rows(acc, w, x_k_ptrs, k_mask, M, stride_xm, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr):
    """acc[:, m] += w @ x[m, k-slice] for each row m, on the CUDA cores: the weight tile
    [BLOCK_N, BLOCK_K] stays in registers; x_k_ptrs: [BLOCK_K] pointers into row 0."""
    w = w.to(tl.float32)
    rm = tl.arange(0, BLOCK_M)
    for m in tl.static_range(BLOCK_M):
        row_ptrs = x_k_ptrs + tl.minimum(m, M - 1) * stride_xm
        if EVEN_K:
            x_m = tl.load(row_ptrs)
        else:
            x_m = tl.load(row_ptrs, mask=k_mask, other=0.0)
        col = tl.sum(w * x_m.to(tl.float32)[None, :], axis=1)
        acc += tl.where(rm[None, :] == m, col[:, None], 0.0)
    return acc


@triton.jit
def _skinny_kernel(
    x_ptr,  # [M, K], unit column stride
    w_ptr,  # [N, K], unit column stride
    bias_ptr,  # [N] (read only when HAS_BIAS)
    out_ptr,  # [M, N] output, or [SPLIT_K, M, N] float32 partial sums
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_split,  # elements between partial-sum slices (0 without split-K)
    k_per_split,  # multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rn_load = tl.minimum(rn, N - 1).to(tl.int64)  # clamped: results past N are not stored
    rm_load = tl.minimum(rm, M - 1)
    w_ptrs = w_ptr + rn_load[:, None] * stride_wn + (k_start + rk)[None, :]
    x_ptrs = x_ptr + rm_load[:, None] * stride_xm + (k_start + rk)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + rk) < k_end
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
        if USE_DOT:
            if EVEN_K:
                x = tl.load(x_ptrs)
            else:
                x = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
            acc += tl.dot(w, tl.trans(x), out_dtype=tl.float32)
        else:
            acc = _fma_rows(acc, w, x_ptr + k + rk, k_mask, M, stride_xm, BLOCK_M, EVEN_K)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn_load).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pid_s * stride_split + rm[None, :] * N + rn[:, None]
    mask = (rn[:, None] < N) & (rm[None, :] < M)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_sum_kernel(
    part_ptr,  # [SPLIT_K, M * N] float32
    bias_ptr,  # [N] (read only when HAS_BIAS)
    out_ptr,  # [M * N]
    total,  # M * N
    N,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * total + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def row_bucket(rows: int) -> int:  # 1, 2, 4, 8, 16
    return triton.next_power_of_2(max(rows, 1))


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def heuristic_config(rows: int, n: int, k: int, num_sms: int = 132) -> GemvConfig:
    """A config for shapes the table lacks (e.g. the Talker's): the FMA path with two output
    columns per program up to 8 rows, else tensor cores; split-K while the grid is small."""
    if rows <= 8:
        return GemvConfig(2, min(2048, triton.next_power_of_2(k)), 1, 4, 1, False)
    split_k = 1
    while triton.cdiv(n, 16) * split_k < 2 * num_sms and k // (split_k * 2) >= 256:
        split_k *= 2
    return GemvConfig(16, 128, split_k, num_warps=4, num_stages=4, use_dot=True)


def config_for(rows: int, n: int, k: int, device: torch.device) -> GemvConfig:
    """The table's config for this shape, else the heuristic one (never None)."""
    found = CONFIGS.get((row_bucket(rows), n, k))
    if found is not None:
        return found
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    return heuristic_config(row_bucket(rows), n, k, sms)


def prefers_cublas(rows: int, n: int, k: int) -> bool:
    """Whether the table marks this shape as one where cuBLAS was faster; shapes it lacks use
    the kernel at 1-2 rows only (on the Talker's shapes the heuristic loses from 4 rows)."""
    key = (row_bucket(rows), n, k)
    return CONFIGS[key] is None if key in CONFIGS else key[0] > 2


def triton_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """x: [M, K] (M <= 16), weight: [N, K], both with unit column stride -> [M, N] in
    `out_dtype` (default x's). Launches the kernels unconditionally (tests, benchmarks)."""
    rows, k = x.shape
    n = weight.shape[0]
    cfg = config or config_for(rows, n, k, x.device)
    out = torch.empty((rows, n), dtype=out_dtype or x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    if splits == 1:
        _launch(x, weight, bias, out, cfg, k_per_split)
        return out
    partial = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device)
    _launch(x, weight, None, partial, cfg, k_per_split)
    block = 1024
    _split_sum_kernel[(triton.cdiv(rows * n, block),)](
        partial, bias if bias is not None else partial, out, rows * n, n,
        SPLIT_K=splits, HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: GemvConfig,
    k_per_split: int,
) -> None:
    """One `_skinny_kernel` launch; `out` is [M, N], or [splits, M, N] float32 partials."""
    rows, k = x.shape
    n = weight.shape[0]
    block_m = max(16, row_bucket(rows)) if cfg.use_dot else row_bucket(rows)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(k, k_per_split))
    _skinny_kernel[grid](
        x, weight, bias if bias is not None else weight, out, rows, n, k,
        x.stride(0), weight.stride(0), rows * n if grid[1] > 1 else 0, k_per_split,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0 and k % k_per_split == 0,
        USE_DOT=cfg.use_dot, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _eligible(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not (x.is_cuda and weight.is_cuda and weight.dim() == 2 and x.dim() >= 1):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    if bias is not None and (bias.dim() != 1 or not bias.is_contiguous()):
        return False
    n, k = weight.shape
    rows = x.numel() // k if k else 0
    if x.shape[-1] != k or not 1 <= rows <= MAX_ROWS or weight.stride(1) != 1:
        return False
    return not prefers_cublas(rows, n, k)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` (cast to `out_dtype` when given) through the Triton kernel
    when x has at most 16 rows of CUDA bf16/fp16 (same dtype as the weight) and the table does
    not prefer cuBLAS for the shape, else F.linear."""
    if not _eligible(x, weight, bias):
        y = F.linear(x, weight, bias)
        return y if out_dtype is None else y.to(out_dtype)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = triton_linear(x2, weight, bias, out_dtype)
    return y.view(*x.shape[:-1], weight.shape[0])


def linear_for(backend: str) -> LinearFn:
    """The linear a decoder's fast path calls for `backend` (see GEMV_BACKENDS)."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"gemv backend must be one of {GEMV_BACKENDS}, got {backend!r}")
    return skinny_linear if backend == "triton" else F.linear
