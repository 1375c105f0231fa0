"""Paged KV cache: one allocation for all layers, viewed per layer as K and V page pools."""

from __future__ import annotations

import torch


class KVCache:
    """K and V pages of every layer, `[num_blocks, block_size, num_kv_heads, head_dim]` each.

    One backing tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]` so the
    whole cache is allocated once (after weights, before any graph capture) and per-layer views
    never move.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str,
    ) -> None:
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        # [num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim] in `dtype`
        self.data = torch.zeros(shape, dtype=dtype, device=device)

    def key_cache(self, layer: int) -> torch.Tensor:
        """[num_blocks, block_size, num_kv_heads, head_dim] view of layer `layer`'s keys."""
        return self.data[layer, 0]

    def value_cache(self, layer: int) -> torch.Tensor:
        """[num_blocks, block_size, num_kv_heads, head_dim] view of layer `layer`'s values."""
        return self.data[layer, 1]

    def num_bytes(self) -> int:
        return self.data.numel() * self.data.element_size()
