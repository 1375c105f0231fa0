"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

A decode step is a chain of ~300 kernels, each of which must wait for the one before it. With
PDL (Hopper and newer) the next kernel's programs are scheduled while the previous kernel's
last wave is still running; they stop at `wait_for_inputs` until that kernel has finished and
its writes are visible. What a program can do before the wait is what does not depend on the
previous kernel: its launch, its address math and, for the tensor-core GEMV, pulling its first
weight tile into L2 (`prefetch_l2`), so the weight stream starts during the previous kernel's
tail. On an H200 (perf/results/runner_h200.md) this took a graphed Thinker step at batch 1 /
1k context from 4.26 to 4.08 ms and at batch 16 / 4k from 6.90 to 6.83 ms, and a Talker step
at batch 1 / 16 from 0.47 / 0.69 to 0.40 / 0.59 ms. Code2Wav's DiT blocks
chain their kernels the same way at small batches (models/token2wav/dit_gemm.py).

The rule that keeps this correct: a kernel launched with PDL calls `wait_for_inputs` in every
program before it reads or writes any tensor another kernel touches, early exits included, so
"kernel n finished" still implies "kernel n - 1 finished" down the chain. `pdl_launch_args`
sets the kernel's PDL flag and the launch option together; kernels launched without it (CPU
interpreter, GPUs older than Hopper) compile the wait away.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

LINE_ELEMENTS: tl.constexpr = tl.constexpr(64)  # 16-bit elements per 128-byte L2 line


def use_pdl(device: torch.device) -> bool:
    """PDL on this device: CUDA on compute capability 9.0 or newer."""
    if device.type != "cuda":
        return False
    return capability_major(device.index or 0) >= 9


@functools.lru_cache(maxsize=None)
def capability_major(device_index: int) -> int:
    """Cached: eager steps ask once per kernel launch."""
    return torch.cuda.get_device_capability(device_index)[0]


def pdl_launch_args(device: torch.device) -> dict[str, Any]:
    """Keyword arguments for a kernel launch: the kernel's `PDL` constexpr and, with it on,
    Triton's `launch_pdl` option (the two must always agree)."""
    if use_pdl(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the previous kernel in the stream finished, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(
    row_ptr, row_stride, rows, col_start, cols_end, BLOCK_COLS: tl.constexpr, ENABLED: tl.constexpr
):
    """With ENABLED, ask L2 for the 128-byte lines of a [rows, BLOCK_COLS] tile of a row-major
    16-bit matrix: `rows` are the (clamped, int64) row indices, columns from col_start (clamped
    to cols_end). A hint with no result: the loads that follow find the lines in L2. Weights
    do not depend on the previous kernel, so a PDL program can do this before it waits."""
    if ENABLED:
        lines = col_start + tl.arange(0, BLOCK_COLS // LINE_ELEMENTS) * LINE_ELEMENTS
        lines = tl.minimum(lines, cols_end - 1)
        ptrs = row_ptr + rows[:, None] * row_stride + lines[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
