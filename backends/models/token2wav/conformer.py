"""Pre-norm Conformer layer of the token2wav encoder: rel-pos attention + FFN, no conv module.

Parameter names follow the reference (`self_attn.linear_q/k/v/out`, `self_attn.linear_pos`,
`self_attn.pos_bias_u/v`, `feed_forward.w_1/w_2`, `norm_mha`, `norm_ff`;
docs/model_facts.md#code2wav-token2wav). Attention is full and bidirectional over the cached keys
plus the window, with Transformer-XL scores: content (q + u) . k plus position (q + v) . W_pos
pe(distance).

On CUDA the attention runs in fewer kernels (`conformer_fused`, same function).

Windows of several streams run as one batch: caches are left-padded to a common length and
new frames right-padded, and a key mask hides both paddings; left padding keeps every row's
distances aligned (see `rel_position`), so a row's result does not depend on the other rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.conformer_fused import fused_attention
from backends.models.token2wav.rel_position import shift_scores

_NORM_EPS = 1e-12  # the reference's Conformer LayerNorm eps


class RelPositionMultiHeadedAttention(nn.Module):
    def __init__(self, size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = size // num_heads
        self.linear_q = nn.Linear(size, size)
        self.linear_k = nn.Linear(size, size)
        self.linear_v = nn.Linear(size, size)
        self.linear_out = nn.Linear(size, size)
        self.linear_pos = nn.Linear(size, size, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(num_heads, self.head_dim))  # [H, dk]
        self.pos_bias_v = nn.Parameter(torch.empty(num_heads, self.head_dim))  # [H, dk]
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)
        # the fewer-kernel form (`conformer_fused`): None = on CUDA only, True also elsewhere
        # (tests), False never (this reference form everywhere)
        self.fused: bool | None = None

    def forward(
        self,
        x: torch.Tensor,  # [B, T, size] normalised window frames
        cache: torch.Tensor,  # [B, H, C, 2 dk] cached keys | values, left-padded
        key_valid: torch.Tensor,  # [B, C + T] bool, False on padding
        pos_rows: torch.Tensor,  # [C + 2 T - 1, size] table rows, distances C + T - 1 .. 1 - T
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (output [B, T, size], this window's keys | values [B, H, T, 2 dk])."""
        if x.is_cuda if self.fused is None else self.fused:
            return fused_attention(self, x, cache, key_valid, pos_rows)
        batch, length, _ = x.shape
        q = self._heads(self.linear_q(x))  # [B, H, T, dk]
        new_kv = torch.cat([self._heads(self.linear_k(x)), self._heads(self.linear_v(x))], -1)
        keys, values = torch.cat([cache, new_kv], dim=2).chunk(2, dim=-1)  # [B, H, C + T, dk]
        pos = self.linear_pos(pos_rows).view(-1, self.num_heads, self.head_dim).transpose(0, 1)
        content = (q + self.pos_bias_u[:, None]) @ keys.transpose(-2, -1)  # [B, H, T, C + T]
        position = shift_scores((q + self.pos_bias_v[:, None]) @ pos.transpose(-2, -1),
                                keys.shape[2])
        scores = (content + position) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ values  # [B, H, T, dk]
        return self.linear_out(out.transpose(1, 2).reshape(batch, length, -1)), new_kv

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, size] -> [B, H, T, dk]."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)


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
        self.self_attn = RelPositionMultiHeadedAttention(size, num_heads)
        self.feed_forward = PositionwiseFeedForward(size, hidden)
        self.norm_mha = nn.LayerNorm(size, eps=_NORM_EPS)
        self.norm_ff = nn.LayerNorm(size, eps=_NORM_EPS)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, size]
        cache: torch.Tensor,  # [B, H, C, 2 dk]
        key_valid: torch.Tensor,  # [B, C + T] bool
        pos_rows: torch.Tensor,  # [C + 2 T - 1, size]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (x [B, T, size], new keys | values [B, H, T, 2 dk])."""
        attended, new_kv = self.self_attn(self.norm_mha(x), cache, key_valid, pos_rows)
        x = x + attended
        return x + self.feed_forward(self.norm_ff(x)), new_kv
