"""MRv2-style model runner: persistent slot tables, paged KV, one mixed forward per step.

Naming vocabulary (used across this package; keep to it):

- `num_*`   a count (`num_tokens`, `num_computed_tokens`, `num_free_blocks`).
- `max_*`   a fixed capacity (`max_num_reqs`, `max_model_len`, `max_blocks_per_req`).
- `cu_*`    a cumulative array of length n + 1 starting at 0 (`cu_num_tokens`); the attention
            metadata calls its query one `query_start_loc` after vLLM.
- `*_np`    a host (numpy) mirror of a device tensor.
- `slot`    a request's persistent row in every per-request table, stable for its whole life
            and recycled after `free_request`; `batch_idx` is a request's row in this step's
            batch; `idx_mapping[batch_idx] -> slot` is the only bridge between the two.
- `position` the RoPE position of a token; equal to its logical KV index (`num_computed_tokens`
            before the row) because re-anchoring keeps the two the same.
- `block`   one KV page of `block_size` tokens; `block_id` indexes the KV pool, and a slot's
            block-table row lists its pages in logical order. `kv_slot` (in `slot_mapping`) is
            `block_id * block_size + offset`, the flat row a token's K/V is written to.
- `is_/has_/can_` booleans.

Stage-level names: `session_id` (Triton correlation id), `unit` (1 s of audio), `epoch`
(barge-in generation).

Host work (slot lookups, block reservation, metadata building) happens in `ModelRunner.step`
before the forward; the forward itself never reads device values back to the host.
"""
