"""build_input_batch: positions, cumulative offsets and slot mappings for a mixed step.

Strategy: a literal expected layout for a prefill chunk with cached context, a decode and a
fresh prefill, in a batch order that differs from slot order.
"""

from __future__ import annotations

import torch

from backends.runner.block_table import BlockTable
from backends.runner.input_batch import build_input_batch


def test_mixed_layout_literal() -> None:
    table = BlockTable(max_num_reqs=4, max_blocks_per_req=3, device="cpu")
    table.set_row(3, [8, 1, 5])
    table.set_row(0, [2, 6])
    table.set_row(1, [7])
    batch = build_input_batch(
        slots=[3, 0, 1],
        num_rows=[3, 1, 2],
        num_computed=[3, 6, 0],
        block_table=table,
        block_size=4,
        backend="reference",
    )
    assert batch.idx_mapping.tolist() == [3, 0, 1]
    assert batch.positions.tolist() == [3, 4, 5, 6, 0, 1]
    assert batch.cu_num_tokens_np.tolist() == [0, 3, 4, 6]
    assert batch.rows(1) == slice(3, 4)
    meta = batch.meta
    assert meta.seq_lens.tolist() == [6, 7, 2] and meta.context_lens.tolist() == [3, 6, 0]
    assert meta.query_start_loc.dtype == torch.int32
    assert meta.block_tables.tolist() == [[8, 1, 5], [2, 6, -1], [7, -1, -1]]
    # slot 3: pos 3 -> block 8 off 3; pos 4, 5 -> block 1; slot 0 pos 6 -> block 6 off 2
    assert meta.slot_mapping.tolist() == [35, 4, 5, 26, 28, 29]
