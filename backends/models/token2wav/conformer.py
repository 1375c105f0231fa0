"""Pre-norm Conformer layer (attention + FFN, no conv module) with a per-stream KV cache.

Parameter names follow the Step-Audio2 encoder (`self_attn.linear_q/k/v/out`,
`feed_forward.w_1/w_2`, `norm_mha`, `norm_ff`). Simplification (fidelity is a later issue):
plain scaled-dot-product attention without the espnet relative-position terms
(`linear_pos`, `pos_bias_u/v`); order comes from the causal convs around the layers.

Windows of several streams run as one ragged batch: caches are left-padded and new frames
right-padded to common lengths, and a key mask hides both paddings, so a row's result does
not depend on the other rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_NORM_EPS = 1e-12  # the reference's Conformer LayerNorm eps


def left_pad_stack(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """rows: [n_i, width] each -> [len(rows), max n_i, width], zeros on the left."""
    length = max((row.shape[0] for row in rows), default=0)
    out = rows[0].new_zeros(len(rows), length, width) if rows else torch.zeros(0, 0, width)
    for batch_idx, row in enumerate(rows):
        if row.shape[0]:
            out[batch_idx, length - row.shape[0] :] = row
    return out


def key_mask(cache_lens: list[int], num_cache: int, new_lens: list[int], num_new: int,
             device: torch.device) -> torch.Tensor:
    """-> [B, num_cache + num_new] bool, True where a key is real (not padding)."""
    cache_idx = torch.arange(num_cache, device=device)
    new_idx = torch.arange(num_new, device=device)
    cache_ok = cache_idx[None, :] >= num_cache - torch.tensor(cache_lens, device=device)[:, None]
    new_ok = new_idx[None, :] < torch.tensor(new_lens, device=device)[:, None]
    return torch.cat([cache_ok, new_ok], dim=1)


class MultiHeadedAttention(nn.Module):
    def __init__(self, size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.linear_q = nn.Linear(size, size)
        self.linear_k = nn.Linear(size, size)
        self.linear_v = nn.Linear(size, size)
        self.linear_out = nn.Linear(size, size)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, size]
        cache_k: torch.Tensor,  # [B, C, size] left-padded
        cache_v: torch.Tensor,  # [B, C, size]
        mask: torch.Tensor,  # [B, C + T] bool, True = attend
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (output [B, T, size], new keys [B, T, size], new values [B, T, size]).

        Full bidirectional attention over cache + window (the window's look-ahead is already
        consumed before the layers, so nothing here sees codes beyond the window)."""
        q, k_new, v_new = self.linear_q(x), self.linear_k(x), self.linear_v(x)
        k = torch.cat([cache_k, k_new], dim=1)
        v = torch.cat([cache_v, v_new], dim=1)
        out = F.scaled_dot_product_attention(
            self._heads(q), self._heads(k), self._heads(v), attn_mask=mask[:, None, None, :]
        )
        out = out.transpose(1, 2).reshape(x.shape)
        return self.linear_out(out), k_new, v_new

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, size] -> [B, heads, T, head_dim]."""
        batch, length, size = x.shape
        return x.view(batch, length, self.num_heads, size // self.num_heads).transpose(1, 2)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, size: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(size, hidden)
        self.w_2 = nn.Linear(hidden, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerEncoderLayer(nn.Module):
    def __init__(self, size: int, num_heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadedAttention(size, num_heads)
        self.feed_forward = PositionwiseFeedForward(size, hidden)
        self.norm_mha = nn.LayerNorm(size, eps=_NORM_EPS)
        self.norm_ff = nn.LayerNorm(size, eps=_NORM_EPS)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, size]
        cache_k: torch.Tensor,  # [B, C, size]
        cache_v: torch.Tensor,  # [B, C, size]
        mask: torch.Tensor,  # [B, C + T] bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, k_new, v_new = self.self_attn(self.norm_mha(x), cache_k, cache_v, mask)
        x = x + attended
        x = x + self.feed_forward(self.norm_ff(x))
        return x, k_new, v_new
