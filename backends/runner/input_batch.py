"""One step's batch layout, built on the host from slot state in one place.

Rows of a request are contiguous and requests keep the caller's order (batch_idx = index in
the step's input list). Positions are the requests' logical KV indices, so they come from
`num_computed_tokens` alone; slot mappings come from the block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from backends.runner.attention import AttentionMetadata
from backends.runner.block_table import BlockTable
from backends.runner.host_staging import to_device


@dataclass(frozen=True, slots=True)
class InputBatch:
    idx_mapping: torch.Tensor  # [num_reqs] int64 batch_idx -> slot
    positions: torch.Tensor  # [num_tokens] int64 RoPE position == logical KV index
    meta: AttentionMetadata
    cu_num_tokens_np: np.ndarray  # [num_reqs + 1] int64 row offsets per request
    positions_np: np.ndarray  # [num_tokens] int64 host mirror of `positions`

    @property
    def num_tokens(self) -> int:
        return int(self.cu_num_tokens_np[-1])

    def rows(self, batch_idx: int) -> slice:
        start, end = self.cu_num_tokens_np[batch_idx], self.cu_num_tokens_np[batch_idx + 1]
        return slice(int(start), int(end))


def build_input_batch(
    slots: list[int],
    num_rows: list[int],
    num_computed: list[int],
    block_table: BlockTable,
    block_size: int,
    backend: str,
) -> InputBatch:
    """slots/num_rows/num_computed: one entry per request in batch order."""
    device = block_table.table.device
    num_rows_np = np.asarray(num_rows, dtype=np.int64)
    context_np = np.asarray(num_computed, dtype=np.int64)
    cu_np = np.zeros(len(slots) + 1, dtype=np.int64)
    np.cumsum(num_rows_np, out=cu_np[1:])
    positions_np = np.concatenate(
        [np.arange(c, c + n, dtype=np.int64) for c, n in zip(context_np, num_rows_np)]
    )
    token_slots_np = np.repeat(np.asarray(slots, dtype=np.int64), num_rows_np)
    idx_mapping = _to_device(np.asarray(slots, dtype=np.int64), device)
    positions = _to_device(positions_np, device)
    block_table.apply_staged_writes()
    meta = AttentionMetadata(
        query_start_loc=_to_device(cu_np.astype(np.int32), device),
        seq_lens=_to_device((context_np + num_rows_np).astype(np.int32), device),
        context_lens=_to_device(context_np.astype(np.int32), device),
        block_tables=block_table.gather(idx_mapping),
        slot_mapping=block_table.compute_slot_mapping(
            _to_device(token_slots_np, device), positions, block_size
        ),
        query_start_loc_np=cu_np.astype(np.int32),
        seq_lens_np=(context_np + num_rows_np).astype(np.int32),
        block_size=block_size,
        backend=backend,
    )
    return InputBatch(idx_mapping, positions, meta, cu_np, positions_np)


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    # A fresh tensor per step, staged through pinned memory on CUDA (no host wait). Graphed
    # decode batches use persistent buffers instead (`cuda_graphs`).
    return to_device(array, device)
