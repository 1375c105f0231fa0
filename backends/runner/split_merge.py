"""Merging split-KV partials (flash-decoding's second kernel).

Each split of a (query tile, kv head) wrote its rows' normalised partial output and base-2
log-sum-exp; a row's output is the partials weighed by 2^(lse - max), over the weights' sum.
One program per (token, head) reads every split of its row at once. In a graphed batch it also
writes zeros into the padding rows (no split wrote them), so they stay finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.runner.pdl import pdl_launch_args, wait_for_inputs


@triton.jit(do_not_specialize=["num_splits"], do_not_specialize_on_alignment=["num_real_ptr"])
def _merge_splits_kernel(
    partial_out_ptr,  # [num_tokens, num_heads, num_splits, head_dim] float32
    partial_lse_ptr,  # [num_tokens, num_heads, num_splits] float32
    out_ptr,  # [num_tokens, num_heads, head_dim]
    num_real_ptr,  # [1] int32 rows that belong to a request (read when ZERO_TAIL)
    num_heads,
    num_splits,
    stride_o_tok,
    stride_o_head,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ZERO_TAIL: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    s_ok = offs_s < num_splits
    if ZERO_TAIL:  # a padding row of a graphed batch reads no split (none wrote it): zeros
        s_ok = s_ok & (tok < tl.load(num_real_ptr))
    base = (tok * num_heads + head) * num_splits
    lse = tl.load(partial_lse_ptr + base + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    offs_d = tl.arange(0, HEAD_DIM)
    parts = tl.load(
        partial_out_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    total = tl.sum(weight, 0)
    out = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    o_offs = tok * stride_o_tok + head * stride_o_head + offs_d
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty))


def merge_splits(
    partial_out: torch.Tensor,  # [tokens, heads, splits, head_dim] float32
    partial_lse: torch.Tensor,  # [tokens, heads, splits] float32
    out: torch.Tensor,  # [tokens, heads, head_dim]
    num_real: torch.Tensor,  # [1] int32 rows that belong to a request (read when zero_tail)
    zero_tail: bool,
) -> None:
    num_tokens, num_heads, splits = partial_lse.shape
    _merge_splits_kernel[(num_tokens, num_heads)](
        partial_out, partial_lse, out, num_real, num_heads, splits, out.stride(0), out.stride(1),
        SPLITS_PAD=triton.next_power_of_2(splits), HEAD_DIM=out.shape[2], ZERO_TAIL=zero_tail,
        num_warps=4, **pdl_launch_args(out.device),
    )  # fmt: skip
