"""BlockTable: host mirror, staged device flush, gather and slot mapping vs numpy references.

Strategy: shuffled (non-contiguous) block ids, block-boundary positions, and a non-identity
batch -> slot mapping, compared against literal tables and a plain numpy formula.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.runner.block_table import PAD_BLOCK_ID, BlockTable


def make_table() -> BlockTable:
    table = BlockTable(max_num_reqs=3, max_blocks_per_req=4, device="cpu")
    table.set_row(0, [7, 2, 9])
    table.set_row(2, [4, 0])
    return table


def test_rows_and_staged_flush() -> None:
    table = make_table()
    assert table.row(0) == [7, 2, 9] and table.row(1) == [] and table.row(2) == [4, 0]
    assert torch.all(table.table == PAD_BLOCK_ID), "device table changed before the flush"
    table.apply_staged_writes()
    assert table.table.tolist() == [[7, 2, 9, -1], [-1, -1, -1, -1], [4, 0, -1, -1]]
    table.clear_row(0)
    table.apply_staged_writes()
    assert table.table[0].tolist() == [-1, -1, -1, -1] and table.row(0) == []


def test_gather_follows_idx_mapping() -> None:
    table = make_table()
    table.apply_staged_writes()
    rows = table.gather(torch.tensor([2, 0]))
    assert rows.tolist() == [[4, 0, -1, -1], [7, 2, 9, -1]]


def test_slot_mapping_matches_numpy_formula() -> None:
    block_size = 4
    table = make_table()
    table.apply_staged_writes()
    token_slots = np.array([2, 2, 2, 2, 2, 0, 0, 0, 0])
    positions = np.array([0, 3, 4, 5, 7, 3, 4, 8, 11])  # block boundaries on both sides
    expected = table.table_np[token_slots, positions // block_size] * block_size + positions % 4
    got = table.compute_slot_mapping(
        torch.from_numpy(token_slots), torch.from_numpy(positions), block_size
    )
    assert got.dtype == torch.int64
    assert got.tolist() == expected.tolist() == [16, 19, 0, 1, 3, 31, 8, 36, 39]


def test_row_longer_than_capacity_is_rejected() -> None:
    table = BlockTable(max_num_reqs=1, max_blocks_per_req=2, device="cpu")
    with pytest.raises(ValueError, match="max_blocks_per_req=2"):
        table.set_row(0, [1, 2, 3])


def test_move_pages_to_end_keeps_the_reservation() -> None:
    table = BlockTable(max_num_reqs=1, max_blocks_per_req=5, device="cpu")
    table.set_row(0, [3, 8, 1, 6, 2])
    table.move_pages_to_end(0, first_page=1, num_pages=2)
    assert table.row(0) == [3, 6, 2, 8, 1]
