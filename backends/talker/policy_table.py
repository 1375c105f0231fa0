"""The Talker's duplex chunk policy for every runner slot at once, as a device table.

The device twin of `TalkerChunkPolicy` (backends/models/talker_policy.py), installed on the
Talker runner as its `DeviceLogitsProcessor`, so Talker rows are drawn by the device sampler
(inside the decode graphs) with no logits row on the host and no Python per row. One int64
row per slot (plus the runner's scratch slot) holds:

- the chunk budget, written by the host only when a chunk starts (`begin_chunk`): policy on,
  max_samples, min_samples, mask EOS after boundaries, boundary mask steps;
- the counters the device advances after every draw (`update`): samples drawn in the chunk,
  chunk done (no chunk open: the next draw is a forced EOS), the ring's write index;
- a ring of the last `penalty_window` forwarded codes (-1 = empty), for upstream's windowed
  frequency penalty: logit * penalty^count if negative, logit / penalty^count otherwise.

Each step does exactly what the host policy does, in the same float32 arithmetic: penalty
scales come from `penalty_powers` (the host's own torch.pow values), EOS is masked by the same
budget rules, a forced EOS replaces the draw, and a drawn EOS closes the chunk without
entering the ring. Rows of slots with the policy off (and the scratch slot) pass unchanged.

`fused_draw` (a `FusedDraw`) does apply, the device sampler's draw and update as one Triton
kernel (backends/talker/draw_kernel.py); the runner's fast path uses it on CUDA, and the torch
methods here stay the reference (and the CPU path).
"""

from __future__ import annotations

import numpy as np
import torch

from backends.models.talker_policy import CHUNK_FRAMES, ChunkBudget, TalkerSamplingConfig
from backends.runner.host_staging import copy_to_device
from backends.runner.types import FusedDraw
from backends.talker.draw_kernel import talker_draw

# Column layout of a slot's row; the ring follows the counters.
_ON, _MAX, _MIN, _MASK_AFTER, _MASK_STEPS, _STEP, _DONE, _HEAD = range(8)
_RING = 8
_EMPTY = -1  # a ring entry that holds no code yet


def penalty_powers(penalty: float, window: int) -> torch.Tensor:
    """[window + 1] float32 penalty^count, computed as the host policy computes each scale
    (torch.pow of a float32 penalty by an integer count, on the CPU)."""
    base = torch.tensor(penalty, dtype=torch.float32)
    return torch.pow(base, torch.arange(window + 1, dtype=torch.int64))


class TalkerPolicyTable:
    """A `DeviceLogitsProcessor` over `max_num_reqs + 1` slots (the last: the scratch slot)."""

    def __init__(
        self,
        max_num_reqs: int,
        device: torch.device | str,
        sampling: TalkerSamplingConfig,
        eos_id: int,
        fused: bool = True,
    ) -> None:
        if sampling.penalty_window < 1:
            raise ValueError("the device policy needs a bounded penalty window (>= 1)")
        self.eos_id = eos_id
        self.window = sampling.penalty_window
        self._is_penalised = sampling.repetition_penalty != 1.0  # 1.0: the host skips it too
        self._powers = penalty_powers(sampling.repetition_penalty, self.window).to(device)
        self._off_row = np.full(_RING + self.window, _EMPTY, dtype=np.int64)
        self._off_row[:_RING] = [0, 1, 0, 0, 0, 0, 1, 0]
        # [max_num_reqs + 1, 8 + window] int64, see the module docstring
        self.table = torch.from_numpy(np.tile(self._off_row, (max_num_reqs + 1, 1))).to(device)
        self.fused_draw: FusedDraw | None = self._draw if fused else None

    # -- host writes (stream-ordered copies, no host wait) ---------------------------------

    def reset_slot(self, slot: int) -> None:
        """The runner handed `slot` to a new request: policy off, empty ring."""
        copy_to_device(self.table[slot], self._off_row)

    def open(self, slot: int, history: torch.Tensor | None = None) -> None:
        """Turn the policy on for a Talker request in `slot`, no chunk open yet, with an
        empty penalty window or `history` (`history()` of the slot it had before)."""
        row = self._off_row.copy()
        row[_ON] = 1
        copy_to_device(self.table[slot], row)
        if history is not None:
            self.table[slot, _HEAD:].copy_(history)

    def history(self, slot: int) -> torch.Tensor:
        """[1 + window] int64 device copy of the slot's ring (index and codes)."""
        return self.table[slot, _HEAD:].clone()

    def begin_chunk(self, slot: int, budget: ChunkBudget) -> None:
        """A new condition starts: its budget, zero samples drawn; the ring is kept."""
        row = [1, budget.max_samples, budget.min_samples, int(budget.mask_eos_after_boundaries),
               budget.boundary_mask_steps, 0, 0]  # fmt: skip
        copy_to_device(self.table[slot, :_HEAD], np.asarray(row, dtype=np.int64))

    # -- device steps (graph-capturable) ---------------------------------------------------

    def apply(self, logits: torch.Tensor, slots: torch.Tensor) -> None:
        """logits: [rows, vocab] float32 in place: windowed penalty, then the EOS mask."""
        rows = self.table.index_select(0, slots)
        if self._is_penalised:
            self._penalise(logits, rows[:, _RING:])
        logits.select(1, self.eos_id).masked_fill_(self._eos_masked(rows), float("-inf"))

    def update(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """tokens: [rows] int64 drawn -> final tokens (forced EOS applied); advances the
        counters and pushes forwarded codes into the ring."""
        rows = self.table.index_select(0, slots)
        is_on = rows[:, _ON] != 0
        forced = is_on & ((rows[:, _DONE] != 0) | (rows[:, _STEP] >= rows[:, _MAX] - 1))
        tokens = torch.where(forced, self.eos_id, tokens)
        is_eos = tokens == self.eos_id
        keeps = is_on & ~is_eos  # a forwarded code enters the penalty window; EOS never does
        head = rows[:, _HEAD : _HEAD + 1]  # [rows, 1]
        ring = rows[:, _RING:]
        ring.scatter_(1, head, torch.where(keeps[:, None], tokens[:, None], ring.gather(1, head)))
        rows[:, _HEAD] = torch.where(keeps, (rows[:, _HEAD] + 1) % self.window, rows[:, _HEAD])
        rows[:, _STEP] += is_on.to(torch.int64)
        rows[:, _DONE] = torch.where(is_on & is_eos, 1, rows[:, _DONE])
        # Duplicate slots (scratch rows of a padded graph) carry identical unchanged rows.
        self.table.index_copy_(0, slots, rows)
        return tokens

    def _draw(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        floats: torch.Tensor,
        ints: torch.Tensor,
    ) -> torch.Tensor:
        """`apply`, the draw and `update` in one kernel (see `FusedDraw`)."""
        policy = (self.table, self._powers)
        return talker_draw(logits, slots, positions, (floats, ints), policy, self.eos_id,
                           self._is_penalised)  # fmt: skip

    def _penalise(self, logits: torch.Tensor, ring: torch.Tensor) -> None:
        """The host's `apply_frequency_penalty` for every row; ring: [rows, window] int64."""
        vocab = logits.shape[1]
        ids = torch.where(ring >= 0, ring, vocab)  # empty entries count in a spare column
        counts = torch.zeros(ring.shape[0], vocab + 1, dtype=torch.int64, device=ring.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids))
        scale = self._powers[counts[:, :vocab]]  # [rows, vocab] float32, 1 for unseen codes
        logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))

    @staticmethod
    def _eos_masked(rows: torch.Tensor) -> torch.Tensor:
        """[rows] bool: `ChunkBudget.is_eos_masked(step)` of each row's open chunk."""
        step = rows[:, _STEP]
        early = step < rows[:, _MIN] - 1
        boundary = (step >= CHUNK_FRAMES) & (step % CHUNK_FRAMES < rows[:, _MASK_STEPS])
        after = (rows[:, _MASK_AFTER] != 0) & boundary
        return (rows[:, _ON] != 0) & (early | after)
