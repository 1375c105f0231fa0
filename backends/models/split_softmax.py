"""Online softmax with the keys split over programs: the pieces the DiT's attention
(token2wav/dit_attention_kernel.py) and the audio encoder's chunk attention
(chunk_attention_kernel.py) share.

A latency-bound attention (few rows, many keys) has too few (query block, row, head) programs
to fill the GPU, each walking every key tile in turn. `key_splits` picks how many programs
share a row's key tiles; each split runs `softmax_step` over its tiles and `store_partial`s its
state (acc | max | sum), and `merge_partials` rescales the splits' states to their common max.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from backends.runner.pdl import wait_for_inputs

# Below this many programs the keys are split: two per SM of an H100 / H200 (132 SMs).
TARGET_PROGRAMS = 264
_MERGE_BLOCK_R = 16


@triton.jit
def dot_for_dtype(a, b, IEEE: tl.constexpr, DOT_F32: tl.constexpr):
    """The DiT's and the attention kernels' matmul. IEEE: full float32 products (float32
    flows; tf32 would miss their parity bound); DOT_F32: float32 operands (Triton's
    interpreter)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def softmax_step(q, k, v, ok, m_i, l_i, acc, sm_scale, IEEE: tl.constexpr,
                 DOT_F32: tl.constexpr):
    """One block of keys into the running max m_i, sum l_i and output acc (float32).
    DOT_F32: dot products of float32 copies (exact for bfloat16 inputs), for Triton's
    interpreter, whose bfloat16 `tl.dot` gives garbage."""
    s = dot_for_dtype(q, tl.trans(k), IEEE, DOT_F32) * sm_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing unmasked yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    acc = acc * alpha[:, None] + dot_for_dtype(p.to(v.dtype), v, IEEE, DOT_F32)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def store_partial(part_ptr, acc, m_i, l_i, entry, ok, dims, HEAD_DIM: tl.constexpr):
    """A split's online-softmax state at partial entries `entry` (acc | max | sum), for
    merge_partials_kernel."""
    base = entry * (HEAD_DIM + 2)
    tl.store(part_ptr + base[:, None] + dims[None, :], acc, mask=ok[:, None])
    tl.store(part_ptr + base + HEAD_DIM, m_i, mask=ok)
    tl.store(part_ptr + base + HEAD_DIM + 1, l_i, mask=ok)


@triton.jit
def merge_partials_kernel(part_ptr, out_ptr, total_rows, SPLITS: tl.constexpr,
                          HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                          PDL: tl.constexpr):
    """out [R T, H D] from the splits' partials [SPLITS, R T, H, D + 2] (acc | max | sum): each
    split's sum and output rescaled to the common max. A query no split saw a key for gets 0."""
    wait_for_inputs(PDL)
    h = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < total_rows
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        base = ((s * total_rows + rows) * HEADS + h) * (HEAD_DIM + 2)
        m = tl.maximum(m, tl.load(part_ptr + base + HEAD_DIM, mask=ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], tl.float32)
    for s in tl.static_range(SPLITS):
        base = ((s * total_rows + rows) * HEADS + h) * (HEAD_DIM + 2)
        weight = tl.exp(tl.load(part_ptr + base + HEAD_DIM, mask=ok, other=float("-inf")) - m_safe)
        l_sum += weight * tl.load(part_ptr + base + HEAD_DIM + 1, mask=ok, other=0.0)
        acc += weight[:, None] * tl.load(part_ptr + base[:, None] + dims[None, :], mask=ok[:, None],
                                         other=0.0)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(out_ptr + (rows[:, None] * HEADS + h) * HEAD_DIM + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def key_splits(programs: int, key_tiles: int) -> int:
    """How many programs share a row's key tiles: enough for ~`TARGET_PROGRAMS` in all, none
    left without a tile; 1 once the GPU is busy."""
    if programs >= TARGET_PROGRAMS or key_tiles <= 1:
        return 1
    per_split = triton.cdiv(key_tiles, min(key_tiles, triton.cdiv(TARGET_PROGRAMS, programs)))
    return triton.cdiv(key_tiles, per_split)


def split_target(out: torch.Tensor, splits: int, total_rows: int, heads: int,
                 head_dim: int) -> torch.Tensor:
    """Where the attention kernel writes: `out` itself for one split, else float32 partials
    [splits, total_rows, heads, head_dim + 2] for `merge_partials`."""
    if splits == 1:
        return out
    return torch.empty(splits, total_rows, heads, head_dim + 2, dtype=torch.float32,
                       device=out.device)


def merge_partials(partials: torch.Tensor, out: torch.Tensor, launch: dict[str, Any]) -> None:
    """out [total_rows, heads head_dim] from `split_target`'s partials (a no-op for one split,
    whose kernel wrote `out`). `launch`: the PDL arguments (backends/runner/pdl.py)."""
    if partials is out:
        return
    splits, total_rows, heads, width = partials.shape
    merge_partials_kernel[(triton.cdiv(total_rows, _MERGE_BLOCK_R), heads)](
        partials, out, total_rows, SPLITS=splits, HEADS=heads, HEAD_DIM=width - 2,
        BLOCK_R=_MERGE_BLOCK_R, num_warps=4, **launch)
