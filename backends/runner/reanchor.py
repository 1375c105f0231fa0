"""KV window re-anchoring: drop rows after a page-aligned kept prefix and re-RoPE the rest.

Whole pages of the dropped rows leave the request's page chain; when the drop is not a whole
number of pages, the retained rows then move down by the remainder inside their pages (keys and
values of every layer, the keys rotated in the same pass), so a cut can land on any unit
boundary. The retained keys are rotated by -drop positions in every layer (values untouched),
so every retained token sits at RoPE position == its new KV index and new rows continue from
there. In layer 0 this is exactly a fresh prefill of the retained tokens; deeper layers keep
the context their K/V was computed with (StreamingLLM semantics; a full re-prefill is the only
way to forget it). The dropped pages move to the end of the request's block-table row instead
of back to the pool: the request keeps its exact reservation and can grow to max_len again.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.block_table import BlockTable
from backends.runner.host_staging import to_device
from backends.runner.kv_cache import KVCache
from backends.runner.request_states import RequestStates
from backends.runner.rope import RotaryEmbedding


def check_reanchor(
    request_id: str, keep_prefix: int, drop: int, num_computed: int, block_size: int
) -> None:
    """Raise ValueError unless the cut keeps whole pages and lies inside the `num_computed`
    tokens."""
    if keep_prefix < 0 or drop < 0 or keep_prefix % block_size:
        raise ValueError(
            f"request {request_id!r}: reanchor keep_prefix={keep_prefix} must be a non-negative "
            f"multiple of block_size {block_size} and drop={drop} non-negative"
        )
    if keep_prefix + drop > num_computed:
        raise ValueError(
            f"request {request_id!r}: reanchor keep_prefix={keep_prefix} + drop={drop} "
            f"exceeds the {num_computed} tokens in KV"
        )


def reanchor_slot(
    slot: int,
    keep_prefix: int,
    drop: int,
    states: RequestStates,
    block_table: BlockTable,
    kv: KVCache,
    rotary: RotaryEmbedding,
) -> None:
    """Apply a checked cut to one slot: block-table row, rotated keys, token ledger."""
    if drop == 0:
        return
    bs = kv.block_size
    num_kept = int(states.num_computed_tokens_np[slot]) - keep_prefix - drop
    first_kept = keep_prefix // bs
    whole_pages, rows_left = divmod(drop, bs)
    block_table.move_pages_to_end(slot, first_kept, whole_pages)
    if rows_left and num_kept:
        pages = block_table.row(slot)[first_kept : first_kept + -(-(rows_left + num_kept) // bs)]
        shift_and_rotate(kv, rotary, pages, rows_left, num_kept, -drop)
    elif num_kept:
        rotate_keys(kv, rotary, block_table.row(slot)[first_kept : first_kept + -(-num_kept // bs)], -drop)
    states.drop_tokens(slot, keep_prefix, drop)


def shift_and_rotate(kv: KVCache, rotary: RotaryEmbedding, block_ids: list[int], shift: int, count: int,
                     delta: int) -> None:
    """Read `block_ids` as one run of rows and move rows [shift, shift + count) to [0, count),
    keys rotated by `delta` positions on the way, values as they are; a layer at a time, so the
    copy is one layer's pages."""
    bs = kv.block_size
    index = to_device(np.asarray(block_ids, dtype=np.int64), kv.data.device)
    for layer in kv.data:  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        rows = layer.index_select(1, index).flatten(1, 2)
        moved = torch.zeros_like(rows)
        moved[0, :count] = rotary.rerotate_keys(rows[0, shift : shift + count], delta)
        moved[1, :count] = rows[1, shift : shift + count]
        layer.index_copy_(1, index, moved.unflatten(1, (len(block_ids), bs)))


def rotate_keys(kv: KVCache, rotary: RotaryEmbedding, block_ids: list[int], delta: int) -> None:
    """Rotate every key in `block_ids`, all layers, by `delta` positions, in place.

    Unfilled tail rows of the last page get rotated too; harmless, they are rewritten before
    any query can read them.
    """
    keys = kv.all_keys()  # [num_layers, num_blocks, block_size, num_kv_heads, head_dim]
    index = to_device(np.asarray(block_ids, dtype=np.int64), keys.device)
    rotated = rotary.rerotate_keys(keys.index_select(1, index), delta)
    keys.index_copy_(1, index, rotated)
