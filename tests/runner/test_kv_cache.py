"""KVCache: one backing tensor, per-layer views that alias it (no copies to drift apart)."""

from __future__ import annotations

import torch

from backends.runner.kv_cache import KVCache


def test_layer_views_alias_the_backing_tensor() -> None:
    kv = KVCache(
        num_layers=2,
        num_blocks=3,
        block_size=4,
        num_kv_heads=2,
        head_dim=8,
        dtype=torch.bfloat16,
        device="cpu",
    )
    assert kv.key_cache(1).shape == (3, 4, 2, 8) and kv.value_cache(0).dtype == torch.bfloat16
    kv.key_cache(1)[2, 3, 1, 7] = 1.0
    kv.value_cache(0)[0, 0, 0, 0] = 2.0
    assert kv.data[1, 0, 2, 3, 1, 7] == 1.0 and kv.data[0, 1, 0, 0, 0, 0] == 2.0
    assert kv.num_bytes() == 2 * 2 * 3 * 4 * 2 * 8 * 2
