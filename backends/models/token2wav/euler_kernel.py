"""One Euler step of the CFM solve with classifier-free guidance, as one Triton kernel.

Between two estimator passes `CausalConditionalCFM._euler` moves the conditional rows' x by
dt * ((1 + rate) * v_cond - rate * v_uncond) and copies the new x into the unconditional rows
of the estimator's input. In torch that is six kernels a step (two scalings, the difference,
the step size, the add, the copy), sixty of the ~2000 launch-bound kernels of a window's solve.
Here it is one, with the float roundings of the torch ops it replaces, so the results are the
same bit for bit: every intermediate is rounded to x's dtype as each torch op's output is, the
step size (a float32 tensor element) is first cast to that dtype as torch casts a 0-dim
operand to the common dtype (checked on CPU and CUDA), the Python scalars are float32 (torch's
opmath), and no multiply-add is contracted (`enable_fp_fusion=False`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _rounded(v, dtype: tl.constexpr):
    """float32 v rounded to `dtype` (to nearest, ties to even) and held as float32. bfloat16 is
    rounded on the bits: Triton's CPU interpreter truncates in `.to(tl.bfloat16)`, and the
    result then converts exactly, so the interpreter and CUDA give the same values."""
    if dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return v.to(dtype).to(tl.float32)


@triton.jit
def _euler_kernel(
    v_ptr, x_ptr, dt_ptr,  # velocity [2 R, C, T] (any strides), estimator input, step size
    rows, channels, frames,
    v_row, v_channel, v_frame,  # velocity strides
    x_row, x_channel, x_frame,  # estimator input strides
    cond_scale, uncond_scale,  # 1 + rate, rate (float32)
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < rows * channels * frames
    frame = offsets % frames
    channel = (offsets // frames) % channels
    row = offsets // (frames * channels)
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    v_at = v_ptr + row * v_row + channel * v_channel + frame * v_frame
    v_cond = tl.load(v_at, mask=mask, other=0.0).to(tl.float32)
    v_uncond = tl.load(v_at + rows * v_row, mask=mask, other=0.0).to(tl.float32)
    guided = _rounded(_rounded(v_cond * cond_scale, dtype) - _rounded(v_uncond * uncond_scale, dtype),
                      dtype)
    step = _rounded(_rounded(tl.load(dt_ptr), dtype) * guided, dtype)
    x_at = x_ptr + row * x_row + channel * x_channel + frame * x_frame
    new = _rounded(tl.load(x_at, mask=mask, other=0.0).to(tl.float32) + step, dtype).to(dtype)
    tl.store(x_at, new, mask=mask)
    tl.store(x_at + rows * x_row, new, mask=mask)


def euler_step(velocity: torch.Tensor, estimator_in: torch.Tensor, rows: int, channels: int,
               step_size: torch.Tensor, rate: float) -> None:
    """In place: x = estimator_in[:rows, :channels] += step_size * ((1 + rate) * v_cond -
    rate * v_uncond), then estimator_in[rows:, :channels] = x; velocity [2 rows, channels, T]
    (v_cond its first rows), step_size a one-element float32 tensor."""
    total_rows, _, frames = estimator_in.shape
    if velocity.shape != (total_rows, channels, frames) or total_rows != 2 * rows:
        raise ValueError(f"velocity {tuple(velocity.shape)} does not match {rows} guided rows "
                         f"of {channels} x {frames}")
    if step_size.numel() != 1:
        raise ValueError(f"one step size, got {step_size.numel()}")
    count = rows * channels * frames
    _euler_kernel[(triton.cdiv(count, _BLOCK),)](
        velocity, estimator_in, step_size, rows, channels, frames,
        *velocity.stride(), *estimator_in.stride(),
        1.0 + rate, rate, BLOCK=_BLOCK, enable_fp_fusion=False,
    )
