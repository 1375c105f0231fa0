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

Launched with programmatic dependent launch where the GPU has it (`pdl`): a program
starts during the previous kernel's tail and, on the tensor-core path, asks L2 for its first
weight tile before it waits for that kernel (the FMA path's small tiles lose by it: H200, a
batch-1 Thinker step 4.48 ms with the prefetch against 4.13 without).

A `Prologue` (`gemv_inputs`) folds the elementwise kernel before a matmul into its loads (a
small batch's step is launch-bound, so a kernel saved is ~2-3 us): RMSNorm (after an optional
residual add) or SwiGLU. A `RopeEpilogue` (`gemv_rope`) rotates a q|k|v matmul's q and k heads
and writes k and v into the paged KV cache as the tiles are stored.

Configurations: `backends.runner.gemv_configs`. Nothing syncs with the host and outputs come from
torch's caching allocator (CUDA-graph safe). Other calls (more rows, CPU, autograd) use F.linear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from backends.runner.gemv_configs import (  # noqa: F401 (re-exported)
    ADD_NORM,
    CONFIGS,
    MAX_ROWS,
    NORM,
    PLAIN,
    SILU_MUL,
    GemvConfig,
    config_for,
    heuristic_config,
    kernel_eligible,
    prefers_cublas,
    row_bucket,
)
from backends.runner.gemv_inputs import Prologue, _dot_rows, _fma_rows
from backends.runner.gemv_rope import RopeEpilogue, _rope_kv_epilogue, rope_epilogue_fits
from backends.runner.pdl import pdl_launch_args, prefetch_l2, wait_for_inputs

GEMV_BACKENDS = ("cublas", "triton")
LinearFn = Callable[..., torch.Tensor]  # (x, weight, bias=None) -> y, like F.linear


@triton.jit
def _skinny_kernel(
    x_ptr,  # [M, K] ([M, 2K] for SwiGLU), unit column stride
    w_ptr,  # [N, K], unit column stride
    bias_ptr,  # [N] (read only when HAS_BIAS)
    out_ptr,  # [M, N] output, or [SPLIT_K, M, N] float32 partial sums
    res_ptr,  # [M, K] residual in (ADD_NORM)
    nw_ptr,  # [K] RMSNorm weight (NORM, ADD_NORM)
    res_out_ptr,  # [M, K] x + residual out (ADD_NORM), written by column block 0
    # ROPE (`gemv_rope`): positions [M] int64, inv_freq [head_dim // 2] float32, each row's flat
    # cache row [M] int64, k/v caches [cache rows, num_kv_heads, head_dim] and their row stride
    positions_ptr, inv_freq_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, stride_cache_tok,
    M, N, K, stride_xm, stride_wn,
    stride_split,  # elements between partial-sum slices (0 without split-K)
    k_per_split,  # multiple of BLOCK_K; all of K for a norm prologue
    eps,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, PROLOGUE: tl.constexpr, PDL: tl.constexpr,
    ROPE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,  # BLOCK_N = head
    PREFETCH: tl.constexpr,  # ask L2 for the first weight tile before waiting (PDL only)
):  # fmt: skip
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm, rk = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_K)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rn_load = tl.minimum(rn, N - 1).to(tl.int64)  # clamped: results past N are not stored
    rm_load = tl.minimum(rm, M - 1)
    w_ptrs = w_ptr + rn_load[:, None] * stride_wn + (k_start + rk)[None, :]
    x_ptrs = x_ptr + rm_load[:, None] * stride_xm + (k_start + rk)[None, :]
    prefetch_l2(w_ptr, stride_wn, rn_load, k_start, k_end, BLOCK_K, PREFETCH)  # `pdl`
    wait_for_inputs(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    sq_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    write = pid_n == 0
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + rk) < k_end
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0, eviction_policy="evict_first")
        if USE_DOT:
            acc, sq_sum = _dot_rows(acc, sq_sum, w, x_ptrs, x_ptr, res_ptr, nw_ptr, res_out_ptr,
                                    k + rk, k_mask, rm, rm_load, M, K, stride_xm, write, EVEN_K,
                                    PROLOGUE)  # fmt: skip
        else:
            acc, sq_sum = _fma_rows(acc, sq_sum, w, x_ptr, res_ptr, nw_ptr, res_out_ptr,
                                    k + rk, k_mask, M, K, stride_xm, write, BLOCK_M, EVEN_K,
                                    PROLOGUE)  # fmt: skip
        w_ptrs, x_ptrs = w_ptrs + BLOCK_K, x_ptrs + BLOCK_K
    if PROLOGUE == 1 or PROLOGUE == 2:
        acc = acc * tl.rsqrt(sq_sum / K + eps)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn_load).to(tl.float32)[:, None]
    if ROPE:
        acc = _rope_kv_epilogue(acc, rm, M, pid_n, positions_ptr, inv_freq_ptr, slot_ptr,
                                k_cache_ptr, v_cache_ptr, stride_cache_tok, NUM_HEADS,
                                NUM_KV_HEADS, BLOCK_N, BLOCK_M)  # fmt: skip
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
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * total + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def triton_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: GemvConfig | None = None,
    prologue: Prologue = Prologue(),
    rope: RopeEpilogue | None = None,
) -> torch.Tensor:
    """x: [M, K] (M <= 16; [M, 2K] for SwiGLU), weight: [N, K], both with unit column stride
    -> [M, N] in `out_dtype` (default x's). Launches the kernels unconditionally (tests,
    benchmarks). A norm prologue takes all of K in one program (no split-K). With `rope` the
    q and k heads come out rotated and k, v are written into its caches (ValueError where
    the config cannot: `rope_epilogue_fits`)."""
    rows, (n, k) = x.shape[0], weight.shape
    cfg = config or config_for(rows, n, k, x.device)
    if prologue.is_norm:
        cfg = replace(cfg, split_k=1)
    if rope is not None and not rope_epilogue_fits(rope, cfg, n):
        raise ValueError(f"the RoPE epilogue needs one head per program on tensor cores, got {cfg}")
    out = torch.empty((rows, n), dtype=out_dtype or x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    if splits == 1:
        _launch(x, weight, bias, out, cfg, k_per_split, prologue, rope)
        return out
    partial = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device)
    _launch(x, weight, None, partial, cfg, k_per_split, prologue)
    block = 1024
    _split_sum_kernel[(triton.cdiv(rows * n, block),)](
        partial, bias if bias is not None else partial, out, rows * n, n,
        SPLIT_K=splits, HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
        **pdl_launch_args(x.device),
    )  # fmt: skip
    return out


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: GemvConfig,
    k_per_split: int,
    prologue: Prologue,
    rope: RopeEpilogue | None = None,
) -> None:
    """One `_skinny_kernel` launch; `out` is [M, N], or [splits, M, N] float32 partials."""
    rows, (n, k) = x.shape[0], weight.shape
    block_m = max(16, row_bucket(rows)) if cfg.use_dot else row_bucket(rows)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(k, k_per_split))
    unused = weight  # a valid pointer for arguments the constexprs never read
    rope_ptrs = (
        (rope.positions, rope.inv_freq, rope.slot_mapping, rope.k_cache, rope.v_cache)
        if rope else (unused,) * 5
    )  # fmt: skip
    rope_heads = (rope.num_heads, rope.num_kv_heads) if rope else (0, 0)
    pdl = pdl_launch_args(x.device)
    _skinny_kernel[grid](
        x, weight, bias if bias is not None else unused, out,
        prologue.residual if prologue.residual is not None else unused,
        prologue.norm_weight if prologue.norm_weight is not None else unused,
        prologue.residual_out if prologue.residual_out is not None else unused,
        *rope_ptrs, rope.k_cache.stride(1) if rope else 0,
        rows, n, k, x.stride(0), weight.stride(0), rows * n if grid[1] > 1 else 0,
        k_per_split, prologue.eps,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0 and k % k_per_split == 0,
        USE_DOT=cfg.use_dot, PROLOGUE=prologue.kind, ROPE=rope is not None,
        NUM_HEADS=rope_heads[0], NUM_KV_HEADS=rope_heads[1], num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, PREFETCH=pdl["PDL"] and cfg.use_dot, **pdl,
    )  # fmt: skip


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` (cast to `out_dtype` when given) through the Triton kernel
    when x has at most 16 rows of CUDA bf16/fp16 (same dtype as the weight) and the table does
    not prefer cuBLAS for the shape, else F.linear."""
    if not kernel_eligible(x, weight, bias):
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
