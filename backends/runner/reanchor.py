"""KV window re-anchoring: drop rows after a kept prefix and re-RoPE the rest.

The pages lying wholly inside the dropped rows leave the request's page chain; the rest of the
drop is a move of the retained rows down inside their pages, to right after the prefix (keys
and values a layer at a time, the keys rotated in the same pass), so the prefix and the cut can
end anywhere: the window keeps exactly the system context and cuts at any unit boundary. The
retained keys are rotated by -drop positions (values untouched), so every retained token sits at
RoPE position == its new KV index and new rows continue from there. In layer 0 this is exactly
a fresh prefill of the prefix and the retained tokens; deeper layers keep the context their K/V
was computed with (StreamingLLM semantics; a full re-prefill is the only way to forget it). The
dropped pages move to the end of the request's block-table row instead of back to the pool: the
request keeps its exact reservation and can grow to max_len again.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.block_table import BlockTable
from backends.runner.host_staging import to_device
from backends.runner.kv_cache import KVCache
from backends.runner.request_states import RequestStates
from backends.runner.rope import RotaryEmbedding


def check_reanchor(request_id: str, keep_prefix: int, drop: int, num_computed: int) -> None:
    """Raise ValueError unless the cut lies inside the `num_computed` tokens."""
    if keep_prefix < 0 or drop < 0:
        raise ValueError(
            f"request {request_id!r}: reanchor keep_prefix={keep_prefix} and drop={drop} must be non-negative"
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
    """Apply a checked cut to one slot: block-table row, moved and rotated rows, token ledger."""
    if drop == 0:
        return
    bs = kv.block_size
    num_kept = int(states.num_computed_tokens_np[slot]) - keep_prefix - drop
    first_page, offset = divmod(keep_prefix, bs)
    first_whole = -(-keep_prefix // bs)  # the first page that holds no prefix row
    whole_pages = max(0, (keep_prefix + drop) // bs - first_whole)
    block_table.move_pages_to_end(slot, first_whole, whole_pages)
    if num_kept:
        shift = drop - whole_pages * bs  # dropped rows still between the prefix and the kept ones
        pages = block_table.row(slot)[first_page : first_page + -(-(offset + shift + num_kept) // bs)]
        shift_and_rotate(kv, rotary, pages, offset, shift, num_kept, -drop)
    states.drop_tokens(slot, keep_prefix, drop)


def shift_and_rotate(kv: KVCache, rotary: RotaryEmbedding, block_ids: list[int], start: int, shift: int,
                     count: int, delta: int) -> None:
    """Read `block_ids` as one run of rows and move rows [start + shift, start + shift + count)
    to [start, start + count), keys rotated by `delta` positions on the way, values as they
    are, rows before `start` untouched; a layer at a time, so the copy is one layer's pages."""
    bs = kv.block_size
    index = to_device(np.asarray(block_ids, dtype=np.int64), kv.data.device)
    src = slice(start + shift, start + shift + count)
    for layer in kv.data:  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        rows = layer.index_select(1, index).flatten(1, 2)
        moved = rows.clone()
        moved[0, start : start + count] = rotary.rerotate_keys(rows[0, src], delta)
        moved[1, start : start + count] = rows[1, src]
        layer.index_copy_(1, index, moved.unflatten(1, (len(block_ids), bs)))
