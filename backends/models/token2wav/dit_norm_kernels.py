"""Fused elementwise kernels of a DiT block, in Triton (the CUDA path of `dit_fused`).

A DiT block is three branches (attention, causal conv, MLP), each entered through
LayerNorm(no affine) * scale + shift and left through x + gate * branch. Done in torch that is
four or five small kernels per branch; here one kernel per row does the gated residual of the
branch before and the norm + modulation of the branch after, in float32 registers with one
rounding per output:

- `residual_norm`: x = x + gate * y (optional); h = LN(x) * scale + shift -> (x, h).
- `residual_norm_taps`: the same, but h is written as the conv's input taps
  [R, T, C, 3] (taps[t, c, k] = padded frame t + k of [2 cached frames | window]), which
  makes the kernel-3 causal conv one GEMM against its weight viewed [C_out, C_in * 3]; the two
  cached frames and the conv's next cache (the two frames before each row's `num_new` + 2)
  are written by the same programs.
- `norm_mish_taps`: LN(affine) + Mish of the first conv's output, written as the second
  conv's taps with its cache frames, likewise.

A branch output read here (y, and the first conv's output) may come as a `SplitSum`
(`dit_gemm`): its float32 parts and bias are summed as the row is loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.models.token2wav.dit_gemm import SplitSum
from backends.runner.pdl import pdl_launch_args, wait_for_inputs

_TAPS = 3  # kernel size of the DiT's causal convs
_CONTEXT = _TAPS - 1
Product = torch.Tensor | SplitSum  # a GEMM output [rows, C], maybe as split-K parts


@triton.jit
def _layer_norm(x, mask, n_cols, eps):
    """Row LayerNorm without affine, float32; masked columns come out 0."""
    mean = tl.sum(x, 0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    return centred * tl.rsqrt(tl.sum(centred * centred, 0) / n_cols + eps)


@triton.jit
def _load_product(ptr, bias_ptr, row, n_rows, n_cols, cols, mask, PARTS: tl.constexpr):
    """Row `row` of a GEMM output [rows, C] in float32; PARTS > 0: of a SplitSum, i.e. its
    bias plus PARTS float32 parts [PARTS, rows, C]."""
    if PARTS == 0:
        return tl.load(ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    total = tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for part in tl.static_range(PARTS):
        total += tl.load(ptr + (part * n_rows + row) * n_cols + cols, mask=mask, other=0.0)
    return total


@triton.jit
def _mish(x):
    """x tanh(softplus x) = x n (n + 2) / (n (n + 2) + 2) with n = e^x (torch: x past 20)."""
    n = tl.exp(tl.minimum(x, 20.0))
    m = n * (n + 2.0)
    return tl.where(x > 20.0, x, x * m / (m + 2.0))


@triton.jit
def _store_frame(taps_ptr, tail_ptr, values, cols, mask, r, s, num_new, n_frames, n_cols,
                 chan_offset, stride_tail):
    """Padded frame s of row r: into the taps of the (up to three) outputs that read it, and
    into the row's next conv cache when s is num_new or num_new + 1."""
    for k in tl.static_range(3):
        t = s - k
        ok = mask & (t >= 0) & (t < n_frames)
        tl.store(taps_ptr + ((r * n_frames + t) * n_cols + cols) * 3 + k, values, mask=ok)
    j = s - num_new
    ok = mask & (j >= 0) & (j < 2)
    tl.store(tail_ptr + r * stride_tail + (chan_offset + cols) * 2 + j, values, mask=ok)


@triton.jit
def _store_conv_frames(taps_ptr, tail_ptr, cache_ptr, num_new_ptr, values, cols, mask, r, t,
                       n_frames, n_cols, chan_offset, s_cache_r, s_cache_c, s_cache_j,
                       stride_tail):
    """Window frame t (padded frame t + 2); programs t < 2 also place cached frame t."""
    num_new = tl.load(num_new_ptr + r)
    _store_frame(taps_ptr, tail_ptr, values, cols, mask, r, t + 2, num_new, n_frames, n_cols,
                 chan_offset, stride_tail)
    if t < 2:
        cached = tl.load(cache_ptr + r * s_cache_r + (chan_offset + cols) * s_cache_c
                         + t * s_cache_j, mask=mask, other=0.0)
        _store_frame(taps_ptr, tail_ptr, cached.to(values.dtype), cols, mask, r, t, num_new,
                     n_frames, n_cols, chan_offset, stride_tail)


@triton.jit
def _residual_norm_kernel(
    x_ptr, y_ptr, y_bias_ptr, gate_ptr, shift_ptr, scale_ptr,  # x, y: [rows, C]; mods [N, C]
    x_out_ptr, h_ptr,  # [rows, C]; h: [rows, C], or taps [R, T, C, 3] when TAPS
    cache_ptr, tail_ptr, num_new_ptr,  # conv cache in [R, 2C, 2], next cache [R, 2C, 2], [R]
    n_rows, n_frames, n_cols, eps, stride_gate, stride_mod, s_cache_r, s_cache_c, s_cache_j,
    stride_tail, HAS_BRANCH: tl.constexpr, Y_PARTS: tl.constexpr, TAPS: tl.constexpr,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    r, t = row // n_frames, row % n_frames
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mod = r * stride_mod + cols
    if HAS_BRANCH:
        gate = tl.load(gate_ptr + r * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
        y = _load_product(y_ptr, y_bias_ptr, row, n_rows, n_cols, cols, mask, Y_PARTS)
        x = (x + gate * y).to(x_out_ptr.dtype.element_ty)
        tl.store(x_out_ptr + row * n_cols + cols, x, mask=mask)
        x = x.to(tl.float32)
    scale = tl.load(scale_ptr + mod, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_ptr + mod, mask=mask, other=0.0).to(tl.float32)
    h = (_layer_norm(x, mask, n_cols, eps) * scale + shift).to(h_ptr.dtype.element_ty)
    if TAPS:
        _store_conv_frames(h_ptr, tail_ptr, cache_ptr, num_new_ptr, h, cols, mask, r, t,
                           n_frames, n_cols, 0, s_cache_r, s_cache_c, s_cache_j, stride_tail)
    else:
        tl.store(h_ptr + row * n_cols + cols, h, mask=mask)


@triton.jit
def _norm_mish_taps_kernel(
    x_ptr, x_bias_ptr, weight_ptr, bias_ptr,  # x [rows, C]: first conv output; LN affine [C]
    taps_ptr, cache_ptr, tail_ptr, num_new_ptr,
    n_rows, n_frames, n_cols, eps, s_cache_r, s_cache_c, s_cache_j, stride_tail,
    X_PARTS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    r, t = row // n_frames, row % n_frames
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = _load_product(x_ptr, x_bias_ptr, row, n_rows, n_cols, cols, mask, X_PARTS)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    h = _mish(_layer_norm(x, mask, n_cols, eps) * weight + bias).to(taps_ptr.dtype.element_ty)
    _store_conv_frames(taps_ptr, tail_ptr, cache_ptr, num_new_ptr, h, cols, mask, r, t,
                       n_frames, n_cols, n_cols, s_cache_r, s_cache_c, s_cache_j, stride_tail)


def _warps(n_cols: int) -> int:
    return max(1, min(8, triton.next_power_of_2(n_cols) // 128))


def _mod_stride(modulation: torch.Tensor, rows: int, n_frames: int) -> int:
    """Row stride of a modulation [N, C] view: 0 when one row serves the whole batch."""
    if modulation.shape[0] not in (1, rows // n_frames) or modulation.stride(1) != 1:
        raise ValueError(f"modulation {tuple(modulation.shape)} does not fit {rows} rows")
    return 0 if modulation.shape[0] == 1 else modulation.stride(0)


def residual_norm(
    x: torch.Tensor,  # [rows, C] contiguous residual stream (rows = R T, frame-major per row)
    branch: tuple[Product, torch.Tensor] | None,  # (y [rows, C], gate [N, C]) or None
    shift: torch.Tensor,  # [N, C], N = 1 or R
    scale: torch.Tensor,  # [N, C] (1 + scale, as `DiT.modulations` gives it)
    n_frames: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (x + gate * y, or x itself without a branch; LN(that) * scale + shift) [rows, C]."""
    h = torch.empty_like(x)
    return _launch_residual(x, branch, shift, scale, n_frames, eps, h, None)


def residual_norm_taps(
    x: torch.Tensor,  # [rows, C]
    branch: tuple[Product, torch.Tensor],  # (y [rows, C], gate [N, C])
    shift: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    conv_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # cache, tail, num_new
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual_norm` whose h becomes the first conv's taps [R, T, C, 3]; also writes the
    first half (channels [0, C)) of the next conv cache `tail` [R, 2C, 2]."""
    rows, n_cols = x.shape
    n_frames = rows // conv_state[2].shape[0]
    taps = x.new_empty(rows, n_cols, _TAPS)
    return _launch_residual(x, branch, shift, scale, n_frames, eps, taps, conv_state)


def _launch_residual(
    x: torch.Tensor, branch: tuple[Product, torch.Tensor] | None, shift: torch.Tensor,
    scale: torch.Tensor, n_frames: int, eps: float, h: torch.Tensor,
    conv_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n_cols = x.shape
    y, gate = branch if branch is not None else (x, shift)
    y, y_bias, y_parts = _product_args(y, (rows, n_cols))
    x_out = torch.empty_like(x) if branch is not None else x
    cache, tail, num_new = conv_state if conv_state is not None else (x[:, :, None], x, shift)
    _check_conv_state(conv_state, rows, n_frames)
    _residual_norm_kernel[(rows,)](
        x, y, y_bias, gate, shift, scale, x_out, h, cache, tail, num_new,
        rows, n_frames, n_cols, eps, _mod_stride(gate, rows, n_frames),
        _mod_stride(shift, rows, n_frames), *cache.stride(),
        tail.stride(0), HAS_BRANCH=branch is not None, Y_PARTS=y_parts,
        TAPS=conv_state is not None, BLOCK=triton.next_power_of_2(n_cols), num_warps=_warps(n_cols),
        **pdl_launch_args(x.device),
    )  # fmt: skip
    return x_out, h


def _check_conv_state(conv_state: tuple[torch.Tensor, ...] | None, rows: int,
                      n_frames: int) -> None:
    if conv_state is None:
        return
    cache, tail, num_new = conv_state
    if n_frames < _CONTEXT or rows != num_new.shape[0] * n_frames:
        raise ValueError(f"conv taps need >= {_CONTEXT} frames per row, got {rows} rows for "
                         f"{num_new.shape[0]} rows of the batch")
    if tail.stride(2) != 1 or tail.stride(1) != 2 or cache.shape[2] != _CONTEXT:
        raise ValueError("conv caches must be [R, 2C, 2] with a contiguous [2C, 2] tail")


def _product_args(y: Product, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (the data pointer's tensor, the bias's (a placeholder for a plain tensor), parts)."""
    if tuple(y.shape) != shape:
        raise ValueError(f"a branch output {tuple(y.shape)} for a [rows, C] of {shape}")
    if isinstance(y, SplitSum):
        return y.parts, y.bias, y.parts.shape[0]
    if not y.is_contiguous():
        raise ValueError("a branch output must be contiguous")
    return y, y, 0


def norm_mish_taps(
    x: Product,  # [rows, C] first conv output (bias added, or a SplitSum)
    norm: torch.nn.LayerNorm,
    conv_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # cache, tail, num_new
) -> torch.Tensor:
    """Mish(LN(x)) as the second conv's taps [R, T, C, 3]; writes the second half (channels
    [C, 2C)) of the next conv cache."""
    rows, n_cols = x.shape
    cache, tail, num_new = conv_state
    n_frames = rows // num_new.shape[0]
    _check_conv_state(conv_state, rows, n_frames)
    taps = cache.new_empty((rows, n_cols, _TAPS), dtype=x.dtype)
    x, x_bias, x_parts = _product_args(x, (rows, n_cols))
    _norm_mish_taps_kernel[(rows,)](
        x, x_bias, norm.weight, norm.bias, taps, cache, tail, num_new, rows, n_frames, n_cols,
        norm.eps, *cache.stride(), tail.stride(0), X_PARTS=x_parts,
        BLOCK=triton.next_power_of_2(n_cols), num_warps=_warps(n_cols), **pdl_launch_args(x.device),
    )  # fmt: skip
    return taps
