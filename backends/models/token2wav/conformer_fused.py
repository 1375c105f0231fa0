"""`RelPositionMultiHeadedAttention.forward` in fewer kernels: the CUDA path of a Conformer
layer's attention (docs/model_facts.md#code2wav-token2wav).

A window's encoder is ten such layers over ~25-50 frames, bound by its kernel count (about 25
small kernels per layer in the reference form, `conformer.py`). Here:

- one GEMM projects q + u and q + v (both already times 1 / sqrt(dk), the scores' scale) and
  the keys | values, laid out per head as the caches keep them (`packed_projection`, built
  once per weight version: `derived_weights`);
- the position scores of all rows come from one batched product per head, read through the
  shift as a strided view, and become the attention's additive bias, -inf on masked keys;
- softmax(content + bias) @ values is one fused attention kernel (`F.scaled_dot_product_attention`).

Same function as the reference form, up to float rounding (the biases are added inside the
GEMM, the softmax is the fused kernel's); tests compare the two on CPU and CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from backends.models.token2wav.derived_weights import derived
from backends.models.token2wav.rel_position import shift_scores

if TYPE_CHECKING:
    from backends.models.token2wav.conformer import RelPositionMultiHeadedAttention

_BIAS_ALIGN = 16  # elements between bias rows that fused attention kernels take as is


def fused_attention(
    attn: RelPositionMultiHeadedAttention,
    x: torch.Tensor,  # [B, T, size] normalised window frames
    cache: torch.Tensor,  # [B, H, C, 2 dk] cached keys | values, left-padded
    key_valid: torch.Tensor,  # [B, C + T] bool
    pos_rows: torch.Tensor,  # [C + 2 T - 1, size]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `RelPositionMultiHeadedAttention.forward`."""
    batch, length, size = x.shape
    heads, dk = attn.num_heads, attn.head_dim
    weight, bias, masked = packed_projection(attn)
    q_u, q_v, kv = F.linear(x, weight, bias).split([size, size, 2 * size], -1)
    new_kv = kv.view(batch, length, heads, 2 * dk).transpose(1, 2)  # [B, H, T, 2 dk], a view
    keys, values = torch.cat([cache, new_kv], dim=2).chunk(2, dim=-1)  # [B, H, C + T, dk]
    # position scores per head over all rows at once: [H, B T, dk] @ [H, dk, C + 2 T - 1]
    pos = attn.linear_pos(pos_rows).view(-1, heads, dk).permute(1, 2, 0)
    position = torch.bmm(q_v.reshape(batch * length, heads, dk).transpose(0, 1), pos)
    position = shift_scores(position.view(heads, batch, length, -1).transpose(0, 1),
                            keys.shape[2])  # [B, H, T, C + T]
    scores_bias = _aligned_like(position)
    torch.where(key_valid[:, None, None, :], position, masked, out=scores_bias)
    q_u = q_u.view(batch, length, heads, dk).transpose(1, 2)
    out = F.scaled_dot_product_attention(q_u, keys, values, attn_mask=scores_bias, scale=1.0)
    return attn.linear_out(out.transpose(1, 2).reshape(batch, length, size)), new_kv


def packed_projection(attn: RelPositionMultiHeadedAttention,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight [4 size, size] and bias of one GEMM whose output columns are [(q + u) s |
    (q + v) s | per head: its keys, then its values], s = 1 / sqrt(dk); and the masked keys'
    score, -inf, as a 0-dim tensor on the weights' device (a host scalar would be copied
    over, synchronously, on every call, and cannot be inside a CUDA graph)."""
    q, k, v = attn.linear_q, attn.linear_k, attn.linear_v
    params = (q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, attn.pos_bias_u,
              attn.pos_bias_v)
    return derived(attn, "_packed_projection", params, lambda: _build_projection(attn))


def _build_projection(attn: RelPositionMultiHeadedAttention,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = attn.linear_q, attn.linear_k, attn.linear_v
    heads, scale = attn.num_heads, attn.head_dim ** -0.5
    scaled = q.weight * scale
    kv_weight = torch.stack([k.weight.view(heads, attn.head_dim, -1),
                             v.weight.view(heads, attn.head_dim, -1)], 1)
    kv_bias = torch.stack([k.bias.view(heads, -1), v.bias.view(heads, -1)], 1)
    q_biases = [((q.bias.float() + u.flatten().float()) * scale).to(q.bias.dtype)
                for u in (attn.pos_bias_u, attn.pos_bias_v)]
    return (torch.cat([scaled, scaled, kv_weight.flatten(0, 2)]),
            torch.cat([*q_biases, kv_bias.flatten()]), q.weight.new_full((), float("-inf")))


def _aligned_like(scores: torch.Tensor) -> torch.Tensor:
    """An empty tensor like `scores` [..., K] whose rows start `_BIAS_ALIGN` elements apart
    (others make the attention kernel pad a copy first)."""
    width = scores.shape[-1]
    padded = scores.new_empty(*scores.shape[:-1], -(-width // _BIAS_ALIGN) * _BIAS_ALIGN)
    return padded[..., :width]
