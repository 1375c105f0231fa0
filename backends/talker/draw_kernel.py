"""The Talker's whole per-step draw as one Triton kernel: chunk policy, sampler, policy update.

On the torch path a chained Talker step spends ~0.3 ms of device time drawing: the policy
table's `apply` (windowed penalty, EOS mask), the device sampler (temperature, a full sort for
top-k/top-p, noise over the vocabulary, argmax) and `update`, each many tiny kernels. Here one
program per row does it all from registers: it gathers its slot's policy row and sampling
params, applies exactly `TalkerPolicyTable.apply`'s float32 arithmetic (the same penalty
powers table, IEEE division), draws with `fused_draw_kernels.draw_row`, then does `update`'s
forced EOS, ring write and counters with masked stores (off rows, the scratch slot included,
store nothing, so duplicated scratch rows never race). The logits are not edited in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.models.talker_policy import CHUNK_FRAMES
from backends.runner.fused_draw_kernels import NEG_INF, draw_row, step_seed

_NUM_WARPS = 8
# The columns of a `TalkerPolicyTable` row (policy_table.py's layout); the ring follows.
_ON, _MAX, _MIN, _MASK_AFTER, _MASK_STEPS, _STEP, _DONE, _HEAD, _RING = (
    tl.constexpr(column) for column in range(9)
)
_TOP_CACHE = 32  # top-k up to this keeps its survivors' values in registers (Talker: 25)


@triton.jit
def _penalised(x, offs, policy, powers_ptr, WINDOW: tl.constexpr):
    """x * penalty^count if negative, x / penalty^count otherwise (count: in the ring)."""
    counts = tl.zeros(x.shape, tl.int32)
    for j in tl.static_range(WINDOW):
        counts += (offs == tl.load(policy + _RING + j)).to(tl.int32)  # empty (-1) matches none
    scale = tl.load(powers_ptr + counts)
    return tl.where(x < 0, x * scale, tl.math.div_rn(x, scale))


@triton.jit
def _eos_masked(policy, CHUNK: tl.constexpr):
    """`TalkerPolicyTable._eos_masked` of one row."""
    step = tl.load(policy + _STEP)
    early = step < tl.load(policy + _MIN) - 1
    boundary = (step >= CHUNK) & (step % CHUNK < tl.load(policy + _MASK_STEPS))
    after = (tl.load(policy + _MASK_AFTER) != 0) & boundary
    return (tl.load(policy + _ON) != 0) & (early | after)


@triton.jit
def _update(policy, token, EOS: tl.constexpr, WINDOW: tl.constexpr):
    """`TalkerPolicyTable.update` of one row: the final token (forced EOS applied)."""
    is_on = tl.load(policy + _ON) != 0
    step = tl.load(policy + _STEP)
    forced = is_on & ((tl.load(policy + _DONE) != 0) | (step >= tl.load(policy + _MAX) - 1))
    token = tl.where(forced, EOS, token)
    is_eos = token == EOS
    keeps = is_on & (token != EOS)  # EOS never enters the penalty window
    head = tl.load(policy + _HEAD)
    tl.store(policy + _RING + head, token, mask=keeps)
    tl.store(policy + _HEAD, (head + 1) % WINDOW, mask=keeps)
    tl.store(policy + _STEP, step + 1, mask=is_on)
    tl.store(policy + _DONE, tl.full((), 1, tl.int64), mask=is_on & is_eos)
    return token


@triton.jit
def _talker_draw_kernel(
    logits_ptr, logits_stride, slots_ptr, positions_ptr, floats_ptr, ints_ptr,
    table_ptr, table_stride, powers_ptr, out_ptr,
    VOCAB: tl.constexpr, EOS: tl.constexpr, WINDOW: tl.constexpr, CHUNK: tl.constexpr,
    PENALISE: tl.constexpr, BLOCK: tl.constexpr, TOP_CACHE: tl.constexpr,
    PRECISE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row)
    policy = table_ptr + slot * table_stride
    offs = tl.arange(0, BLOCK)
    valid = offs < VOCAB
    x = tl.load(logits_ptr + row * logits_stride + offs, mask=valid, other=NEG_INF)
    if PENALISE:
        x = _penalised(x, offs, policy, powers_ptr, WINDOW)
    x = tl.where((offs == EOS) & _eos_masked(policy, CHUNK), NEG_INF, x)
    temperature, top_p = tl.load(floats_ptr + 2 * slot), tl.load(floats_ptr + 2 * slot + 1)
    top_k = tl.load(ints_ptr + 2 * slot)
    seed = step_seed(tl.load(ints_ptr + 2 * slot + 1), tl.load(positions_ptr + row))
    token = draw_row(x, offs, valid, temperature, top_k, top_p, seed, TOP_CACHE, PRECISE)
    tl.store(out_ptr + row, _update(policy, token, EOS, WINDOW))


def talker_draw(
    logits: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    sampling: tuple[torch.Tensor, torch.Tensor],
    policy: tuple[torch.Tensor, torch.Tensor],
    eos_id: int,
    is_penalised: bool,
) -> torch.Tensor:
    """logits: [rows, vocab] float32; slots, positions: [rows] int64; sampling: the runner's
    per-slot ([slots, 2] float32 temperature/top_p, [slots, 2] int64 top_k/seed); policy: the
    table ([slots, 8 + window] int64, updated in place) and its penalty powers -> [rows] int64."""
    table, powers = policy
    floats, ints = sampling
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return tokens
    _talker_draw_kernel[(rows,)](
        logits, logits.stride(0), slots, positions, floats.contiguous(), ints.contiguous(),
        table, table.stride(0), powers, tokens,
        VOCAB=vocab, EOS=eos_id, WINDOW=table.shape[1] - _RING.value, CHUNK=CHUNK_FRAMES,
        PENALISE=is_penalised, BLOCK=triton.next_power_of_2(vocab), TOP_CACHE=_TOP_CACHE,
        PRECISE=logits.is_cuda,
        num_warps=_NUM_WARPS,
    )  # fmt: skip
    return tokens
