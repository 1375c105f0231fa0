"""Per-slot block tables: a persistent device table plus its host mirror, and slot mappings.

Rows are written on the host mirror and flushed to the device table once per step
(`apply_staged_writes`), so the device tensor keeps one address for the runner's whole life
(CUDA graphs bake addresses in) and only changed rows cross the bus.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.host_staging import to_device

PAD_BLOCK_ID = -1  # unused table entries; never a valid index into the KV pool


class BlockTable:
    def __init__(self, max_num_reqs: int, max_blocks_per_req: int, device: str) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        shape = (max_num_reqs, max_blocks_per_req)
        # [max_num_reqs, max_blocks_per_req] int32 host mirror (the source of truth)
        self.table_np = np.full(shape, PAD_BLOCK_ID, dtype=np.int32)
        # [max_num_reqs] int32 valid entries per row
        self.num_blocks_np = np.zeros(max_num_reqs, dtype=np.int32)
        # [max_num_reqs, max_blocks_per_req] int32 device table, persistent address
        self.table = torch.full(shape, PAD_BLOCK_ID, dtype=torch.int32, device=device)
        self._dirty_slots: set[int] = set()

    def set_row(self, slot: int, block_ids: list[int]) -> None:
        if len(block_ids) > self.max_blocks_per_req:
            raise ValueError(
                f"{len(block_ids)} blocks exceed max_blocks_per_req={self.max_blocks_per_req}"
            )
        self.table_np[slot, :] = PAD_BLOCK_ID
        self.table_np[slot, : len(block_ids)] = block_ids
        self.num_blocks_np[slot] = len(block_ids)
        self._dirty_slots.add(slot)

    def clear_row(self, slot: int) -> None:
        self.set_row(slot, [])

    def move_pages_to_end(self, slot: int, first_page: int, num_pages: int) -> None:
        """Move pages [first_page, first_page + num_pages) of a row to its end; later pages
        move up. The row keeps the same blocks, so a request's reservation is unchanged."""
        row = self.row(slot)
        moved = row[first_page : first_page + num_pages]
        self.set_row(slot, row[:first_page] + row[first_page + num_pages :] + moved)

    def row(self, slot: int) -> list[int]:
        return self.table_np[slot, : self.num_blocks_np[slot]].tolist()

    def apply_staged_writes(self) -> None:
        """Flush rows changed since the last call to the device table (one copy)."""
        if not self._dirty_slots:
            return
        slots = sorted(self._dirty_slots)
        rows = to_device(self.table_np[slots], self.table.device)
        self.table[to_device(np.asarray(slots, dtype=np.int64), self.table.device)] = rows
        self._dirty_slots.clear()

    def gather(self, idx_mapping: torch.Tensor) -> torch.Tensor:
        """idx_mapping: [num_reqs] int64 batch_idx -> slot.
        Returns [num_reqs, max_blocks_per_req] int32 rows in batch order."""
        return self.table.index_select(0, idx_mapping)

    def compute_slot_mapping(
        self, token_slots: torch.Tensor, token_positions: torch.Tensor, block_size: int
    ) -> torch.Tensor:
        """Flat KV row of every token: block_table[slot, pos // bs] * bs + pos % bs.

        token_slots: [num_tokens] int64 slot of each token's request;
        token_positions: [num_tokens] int64 logical KV index of each token.
        Returns [num_tokens] int64. Runs on the table's device without host reads.
        """
        block_ids = self.table[token_slots, token_positions // block_size].to(torch.int64)
        return block_ids * block_size + token_positions % block_size
