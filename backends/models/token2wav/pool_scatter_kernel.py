"""Writing a window's kept new DiT frames into the cache pool, in Triton (`EstimatorPool.commit`).

In torch the write is `att[:, :, rows, :, positions] = new_kv[:, :, dit_rows, :, frames]`: the
indexed dims sit between kept ones, so it runs as a gather into a temporary and an
element-wise scatter, ~100 us each for one stream on an H200 (perf/results/stages_h200.md).
Here one program copies one written frame of one (CFM step, DiT block): all heads' key|value
rows, contiguous runs of 2 head_dim values, with no temporary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _scatter_frames_kernel(
    att_ptr, new_ptr, writes_ptr,  # att [S, D, pool rows, H, positions, E]; new [S, D, R, H, T, E]
    n_writes, depth, n_heads, n_elems,
    sa_s, sa_d, sa_r, sa_h, sa_p,  # att strides (E contiguous)
    sn_s, sn_d, sn_r, sn_h, sn_t,  # new_kv strides (E contiguous)
    BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr,
):
    w = tl.program_id(0).to(tl.int64)
    step_block = tl.program_id(1).to(tl.int64)
    s, d = step_block // depth, step_block % depth
    pool_row = tl.load(writes_ptr + w)
    position = tl.load(writes_ptr + n_writes + w)
    dit_row = tl.load(writes_ptr + 2 * n_writes + w)
    frame = tl.load(writes_ptr + 3 * n_writes + w)
    heads = tl.arange(0, BLOCK_H)[:, None]
    elems = tl.arange(0, BLOCK_E)[None, :]
    mask = (heads < n_heads) & (elems < n_elems)
    src = new_ptr + s * sn_s + d * sn_d + dit_row * sn_r + frame * sn_t + heads * sn_h + elems
    dst = att_ptr + s * sa_s + d * sa_d + pool_row * sa_r + position * sa_p + heads * sa_h + elems
    tl.store(dst, tl.load(src, mask=mask), mask=mask)


def scatter_frames(att: torch.Tensor, new_kv: torch.Tensor, writes: torch.Tensor) -> None:
    """att[:, :, writes[0], :, writes[1]] = new_kv[:, :, writes[2], :, writes[3]].

    att [steps, depth, pool rows, H, positions, E], new_kv [steps, depth, R, H, T, E] (same
    dtype and device, E contiguous in both); writes [4, W] int64 on that device."""
    if att.dtype != new_kv.dtype or att.shape[:2] != new_kv.shape[:2] or \
            att.shape[3] != new_kv.shape[3] or att.shape[5] != new_kv.shape[5]:
        raise ValueError(f"new frames {tuple(new_kv.shape)} {new_kv.dtype} do not fit the pool "
                         f"{tuple(att.shape)} {att.dtype}")
    if att.stride(5) != 1 or new_kv.stride(5) != 1 or writes.shape[0] != 4:
        raise ValueError("scatter_frames needs contiguous last dims and writes [4, W]")
    if not att.device == new_kv.device == writes.device:
        raise ValueError(f"pool on {att.device}, new frames on {new_kv.device}, writes on "
                         f"{writes.device}: all must share one device")
    writes = writes.contiguous()
    n_writes = writes.shape[1]
    steps, depth, _, heads, _, elems = att.shape
    if n_writes == 0:
        return
    _scatter_frames_kernel[(n_writes, steps * depth)](
        att, new_kv, writes, n_writes, depth, heads, elems,
        *att.stride()[:5], *new_kv.stride()[:5],
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_E=triton.next_power_of_2(elems),
        num_warps=4,
    )  # fmt: skip
