"""One Triton pass for the elementwise work between HiFT's convolutions (its CUDA path).

In torch a Snake activation `v + sin^2(alpha v) / alpha` is five full passes over a tensor at
up to the sample rate (mul, sin, pow, mul, add), and every conv adds its bias, every residual
and stage sum one pass more. `conv_epilogue` does all of it in one: it reads a conv output
(taken without bias) and computes, in the order and float32 roundings of the torch
expressions it replaces (so results match them bit for bit on CUDA, up to the sign of an exact
zero):

    v = extra + (residual + (y + bias))        each term optional
    act = snake_alpha(v)  or  leaky_relu(v * scale, slope)   (optional)

and writes v and/or act. Exactness details: the reciprocal of alpha + 1e-9 is IEEE-rounded
(`div_rn`, like torch's reciprocal), sin is libdevice's sinf (torch's sin; the interpreter on
CPU uses numpy's), mul + add are not contracted to FMAs (`enable_fp_fusion=False`), and the
mean over resblocks is a multiply by the float32 reciprocal, as torch's CUDA division by a
Python number is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from backends.models.token2wav.resblock import ALPHA_EPS

_BLOCK = 1024
_NO_ACT, _SNAKE, _LEAKY = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SnakeAct:
    """Snake with one alpha per channel (`resblock.Snake`)."""

    alpha: torch.Tensor  # [C] float32


@dataclass(frozen=True, slots=True)
class MeanLeakyAct:
    """leaky_relu(v / count, slope): the mean of `count` resblock outputs, then the activation
    that enters the next up-sampling (or conv_post)."""

    count: int
    slope: float


# Not specialised on the sizes, one block width: a final window of a new length (a HiFT graph
# captured in serving) then launches variants compiled at load, not new ones (~0.5 s each).
@triton.jit(do_not_specialize=["n_channels", "n_cols"])
def _epilogue_kernel(
    y_ptr, bias_ptr, res_ptr, extra_ptr, alpha_ptr, sum_ptr, act_ptr,  # [R, T], [C]
    n_channels, n_cols, scale, slope, eps,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_EXTRA: tl.constexpr,
    STORE_SUM: tl.constexpr, ACT: tl.constexpr, ACCURATE_SIN: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    offsets = row.to(tl.int64) * n_cols + cols
    channel = row % n_channels
    v = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    if HAS_BIAS:
        v = v + tl.load(bias_ptr + channel)
    if HAS_RES:
        v = tl.load(res_ptr + offsets, mask=mask, other=0.0) + v
    if HAS_EXTRA:
        v = tl.load(extra_ptr + offsets, mask=mask, other=0.0) + v
    if STORE_SUM:
        tl.store(sum_ptr + offsets, v, mask=mask)
    if ACT == 1:
        alpha = tl.load(alpha_ptr + channel)
        inv_alpha = tl.math.div_rn(1.0, alpha + eps)
        if ACCURATE_SIN:
            wave = libdevice.sin(v * alpha)
        else:
            wave = tl.sin(v * alpha)
        tl.store(act_ptr + offsets, v + inv_alpha * (wave * wave), mask=mask)
    if ACT == 2:
        mean = v * scale
        tl.store(act_ptr + offsets, tl.where(mean > 0, mean, mean * slope), mask=mask)


def conv_epilogue(
    y: torch.Tensor,  # [B, C, T] float32 contiguous, a conv output without its bias
    bias: torch.Tensor | None = None,  # [C]
    residual: torch.Tensor | None = None,  # [B, C, T]
    extra: torch.Tensor | None = None,  # [B, C, T]
    act: SnakeAct | MeanLeakyAct | None = None,
    keep_sum: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """-> (v if keep_sum else None, act(v) if act else None); see the module docstring."""
    if y.dtype != torch.float32 or y.dim() != 3 or not y.is_contiguous():
        raise ValueError(f"conv_epilogue wants a contiguous float32 [B, C, T], got {y.dtype} "
                         f"{tuple(y.shape)}")
    for other in (residual, extra):
        if other is not None and (other.shape != y.shape or not other.is_contiguous()):
            raise ValueError(f"operand {tuple(other.shape)} does not match {tuple(y.shape)}")
    batch, channels, cols = y.shape
    summed = torch.empty_like(y) if keep_sum else None
    out = torch.empty_like(y) if act is not None else None
    alpha = act.alpha if isinstance(act, SnakeAct) else None
    scale, slope = _leaky_args(act)
    grid = (batch * channels, triton.cdiv(cols, _BLOCK))
    _epilogue_kernel[grid](
        y, _or(bias, y), _or(residual, y), _or(extra, y), _or(alpha, y), _or(summed, y),
        _or(out, y), channels, cols, scale, slope, ALPHA_EPS,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_EXTRA=extra is not None,
        STORE_SUM=keep_sum, ACT=_act_code(act), ACCURATE_SIN=not _interpreted(),
        BLOCK=_BLOCK, enable_fp_fusion=False,
    )
    return summed, out


def _leaky_args(act: SnakeAct | MeanLeakyAct | None) -> tuple[float, float]:
    """(scale, slope): torch's CUDA `x / n` multiplies by the float32 1 / n."""
    if not isinstance(act, MeanLeakyAct):
        return 1.0, 0.0
    return float(np.float32(1.0) / np.float32(act.count)), act.slope


def _act_code(act: SnakeAct | MeanLeakyAct | None) -> int:
    if act is None:
        return _NO_ACT
    return _SNAKE if isinstance(act, SnakeAct) else _LEAKY


def _or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A pointer for an operand the kernel's flags leave unread."""
    return placeholder if tensor is None else tensor


def _interpreted() -> bool:
    """Triton's CPU interpreter has no libdevice (extern) calls."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def conv_no_bias(conv: torch.nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """`conv(x)` without its bias (which `conv_epilogue` adds; torch's cuDNN path adds it in a
    separate pass, so the sum rounds the same)."""
    return conv._conv_forward(x, conv.weight, None)
