"""One decode-chain step's bookkeeping on the device in one kernel.

Between two steps of a decode chain (`decode_chain`) every staged row that belongs to a request
takes its drawn token as its next input, moves one position on (sequence and context lengths
+ 1) and looks its next KV slot up in its staged block-table row; padding rows (sampling slot
= the scratch slot) keep their staging and input token 0. As torch ops this was ~14 tiny
kernels per step, ~60 us of a Talker step of ~0.55 ms inside a chain's CUDA graph; here it is
one program per row. Buffers are `DecodeGraphs`' persistent ones, so a captured graph replays
it over whatever is staged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _advance_kernel(
    i64_ptr,  # [4, cap] int64: token ids, positions, KV slot mapping, sampling slots
    i32_ptr,  # [cap * (2 + max_blocks)] int32: seq lens, context lens, block-table rows
    tokens_ptr,  # [>= rows] int64 drawn tokens, batch order
    cap,
    scratch_slot,
    block_size,
    max_blocks,
):
    row = tl.program_id(0)
    live = tl.load(i64_ptr + 3 * cap + row) != scratch_slot
    token = tl.load(tokens_ptr + row)
    tl.store(i64_ptr + row, tl.where(live, token, 0))
    step = live.to(tl.int64)
    position = tl.load(i64_ptr + cap + row) + step
    tl.store(i64_ptr + cap + row, position)
    for lens in tl.static_range(2):  # sequence length, then context length
        length = tl.load(i32_ptr + lens * cap + row)
        tl.store(i32_ptr + lens * cap + row, length + step.to(tl.int32))
    table_row = i32_ptr + 2 * cap + row * max_blocks
    page = tl.load(table_row + position // block_size, mask=live, other=0).to(tl.int64)
    slot_ptr = i64_ptr + 2 * cap + row
    staged = tl.load(slot_ptr)
    tl.store(slot_ptr, tl.where(live, page * block_size + position % block_size, staged))


def advance_rows(
    i64: torch.Tensor,
    i32: torch.Tensor,
    tokens: torch.Tensor,
    rows: int,
    scratch_slot: int,
    block_size: int,
    max_blocks: int,
) -> None:
    """Advance the first `rows` staged rows in place (shapes as `_advance_kernel` says)."""
    cap = i64.shape[1]
    _advance_kernel[(rows,)](
        i64, i32, tokens, cap, scratch_slot, block_size, max_blocks, num_warps=1
    )
