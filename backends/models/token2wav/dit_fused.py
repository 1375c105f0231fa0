"""`DiT.forward_modulated` with fused kernels: the CUDA path
(docs/model_facts.md#code2wav-token2wav).

The torch path (`dit.DiTBlock`) is the reference; this one computes the same function with
about a dozen kernels per block instead of ~55, since a window's CFM solve is bound by kernel
count, not FLOPs (perf/results/stages_h200.md):

- the six GEMMs: q|k|v as one (weights concatenated once, see `packed_qkv`; the checkpoint
  keeps to_q/to_k/to_v), the output projection, both causal convs as GEMMs over their taps
  (`dit_norm_kernels`), fc1 (with the tanh-GELU epilogue) and fc2; at small batches they run
  as Triton kernels (split over K where a norm kernel reads the product), so the whole block
  is one chain of dependent launches (`dit_gemm`);
- three `dit_norm_kernels` kernels: every gated residual is fused with the norm + modulation
  of the branch after it (the MLP gate of block b with block b + 1's attention norm);
- one `dit_attention_kernel` kernel for q/k norms, the cache entries and masked attention.

Caches come out in preallocated [depth, ...] tensors, so no per-block stacking either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from backends.models.token2wav.derived_weights import derived
from backends.models.token2wav.dit_attention_kernel import masked_attention
from backends.models.token2wav.dit_gemm import linear, linear_split
from backends.models.token2wav.dit_norm_kernels import (
    Product,
    norm_mish_taps,
    residual_norm,
    residual_norm_taps,
)

if TYPE_CHECKING:
    from backends.models.token2wav.dit import DiT, DiTBlock

# modulation rows (DiT.modulations): shift, scale, gate of attention, MLP, conv
_MSA, _MLP, _CONV = 0, 3, 6
Branch = tuple[Product, torch.Tensor]  # (branch output [rows, C], its gate [N, C])


def packed_qkv(attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """[to_q; to_k; to_v] weight [3 inner, hidden] and bias, kept on the module until a weight
    changes (`derived_weights`)."""
    layers = (attn.to_q, attn.to_k, attn.to_v)
    params = [layer.weight for layer in layers] + [layer.bias for layer in layers]
    weight, bias = derived(attn, "_packed_qkv", params,
                           lambda: (torch.cat(params[:3]), torch.cat(params[3:])))
    return weight, bias


def _conv_gemm(taps: torch.Tensor, conv: torch.nn.Conv1d) -> Product:
    """taps [rows, C_in, 3] -> [rows, C_out]: the kernel-3 conv over its padded input
    (split over K at small batches, `dit_gemm`)."""
    weight = conv.weight.reshape(conv.weight.shape[0], -1)  # [C_out, C_in * 3], a view
    return linear_split(taps.view(taps.shape[0], -1), weight, conv.bias)


def fused_block(
    block: DiTBlock,
    x: torch.Tensor,  # [rows, C] residual stream before `pending` is added
    pending: Branch | None,  # the previous block's MLP output and gate
    mod: torch.Tensor,  # [N, 9, C] this block's modulation (N = 1 or R)
    caches: tuple[torch.Tensor, torch.Tensor],  # cnn [R, 2C, 2], att [R, H, L, 2 dk]
    outputs: tuple[torch.Tensor, torch.Tensor],  # next cnn [R, 2C, 2], new kv [R, H, T, 2 dk]
    key_valid: torch.Tensor,  # [R, T + L] bool
    num_new: torch.Tensor,  # [R] int64
    cache_index: tuple[torch.Tensor, torch.Tensor] | None = None,  # pooled att: rows, order
) -> tuple[torch.Tensor, Branch]:
    """-> (residual stream without this block's MLP branch, that branch)."""
    n_frames = outputs[1].shape[2]
    x, h = residual_norm(x, pending, mod[:, _MSA], mod[:, _MSA + 1], n_frames, block.norm1.eps)
    attn = block.attn
    qkv = linear(h, *packed_qkv(attn))
    attended = linear_split(masked_attention(qkv, attn.q_norm, attn.k_norm, caches[1], key_valid,
                                             outputs[1], cache_index), attn.proj.weight, attn.proj.bias)
    conv_state = (caches[0], outputs[0], num_new)
    x, taps = residual_norm_taps(x, (attended, mod[:, _MSA + 2]), mod[:, _CONV],
                                 mod[:, _CONV + 1], block.norm3.eps, conv_state)
    layers = block.conv.block
    taps = norm_mish_taps(_conv_gemm(taps, layers[1]), layers[3], conv_state)
    x, h = residual_norm(x, (_conv_gemm(taps, layers[6]), mod[:, _CONV + 2]), mod[:, _MLP],
                         mod[:, _MLP + 1], n_frames, block.norm2.eps)
    fc2 = block.mlp.fc2
    hidden = linear(h, block.mlp.fc1.weight, block.mlp.fc1.bias, gelu=True)
    return x, (linear_split(hidden, fc2.weight, fc2.bias), mod[:, _MLP + 2])


def fused_forward(
    dit: DiT,
    inputs: torch.Tensor,  # [R, 320, T]
    blocks: torch.Tensor,  # [depth, N, 9, hidden]
    final: torch.Tensor,  # [N, 2, hidden]
    cnn_cache: torch.Tensor,  # [depth, R, 2 hidden, 2]
    att_cache: torch.Tensor,  # [depth, R, H, L, 2 head_dim]
    key_valid: torch.Tensor,  # [R, T + L] bool
    num_new: torch.Tensor,  # [R] int64
    cache_index: tuple[torch.Tensor, torch.Tensor] | None = None,  # pooled att: rows, order
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `DiT.forward_modulated`."""
    rows_b, _, n_frames = inputs.shape
    c = dit.config
    x = dit.in_proj(inputs.transpose(1, 2)).reshape(rows_b * n_frames, c.hidden_size)
    new_cnn = x.new_empty(c.depth, rows_b, 2 * c.hidden_size, 2)
    new_kv = x.new_empty(c.depth, rows_b, c.num_heads, n_frames, 2 * c.head_dim)
    pending = None
    for index, block in enumerate(dit.blocks):
        x, pending = fused_block(block, x, pending, blocks[index],
                                 (cnn_cache[index], att_cache[index]),
                                 (new_cnn[index], new_kv[index]), key_valid, num_new,
                                 cache_index)
    layer = dit.final_layer
    _, h = residual_norm(x, pending, final[:, 0], final[:, 1], n_frames, layer.norm_final.eps)
    velocity = layer.linear(h).view(rows_b, n_frames, -1).transpose(1, 2)
    return velocity, new_cnn, new_kv
