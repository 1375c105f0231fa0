"""The pre-norm decoder stack shared by Qwen3 and Llama, over the runner's paged KV cache.

Module and parameter names equal Hugging Face's (`embed_tokens`, `layers.N.self_attn.q_proj`,
`layers.N.mlp.gate_proj`, `input_layernorm`, `norm`, ...), so a transformers state dict loads
with a plain `load_state_dict`. Qwen3 differs from Llama only by the per-head q/k RMSNorm
(applied before RoPE), which `BackboneSpec.has_qk_norm` switches on.

With the "triton" attention backend the stack runs its fast path (`_forward_fused`): q|k|v and
gate|up each become one matmul over a fused weight, and the elementwise work between matmuls
runs in the fused kernels of `backends.runner.triton_layer_ops`, or inside the next matmul
where `backends.runner.fused_linears` folds it into the Triton GEMV. The fused weights are built
once, lazily, and the HF-named parameters are re-pointed to views of them, so the state dict
and the memory footprint stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from backends.runner.attention import AttentionMetadata, attend, write_kv
from backends.runner.kv_cache import KVCache
from backends.runner.rope import RotaryEmbedding, apply_rotary


@dataclass(frozen=True, slots=True)
class BackboneSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    has_qk_norm: bool
    has_attention_bias: bool = False
    has_mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


def require_positive(owner: str, values: dict[str, object]) -> None:
    """Raise ValueError naming the first non-positive (or non-numeric) entry of `values`."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, normalised in float32 like HF."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


FusedLinear = tuple[torch.Tensor, torch.Tensor | None]  # ([out, in] weight, [out] bias)
LinearFn = Callable[..., torch.Tensor]  # (x, weight, bias) -> y, like F.linear


def fuse_linears(linears: Sequence[nn.Linear]) -> FusedLinear:
    """One weight (and bias) for linears that share an input, rows in `linears` order.

    Each linear's parameters become views of the fused tensors, so loading a state dict
    afterwards still updates the fused weight and no second copy stays alive. Call it after
    the module reached its final device and dtype (`is_fused` notices a later move).
    """
    with torch.no_grad():
        weight = torch.cat([linear.weight.detach() for linear in linears], dim=0)
        biases = [linear.bias for linear in linears if linear.bias is not None]
        bias = torch.cat([b.detach() for b in biases]) if biases else None
        offset = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight.data = weight[offset : offset + rows]
            if bias is not None and linear.bias is not None:
                linear.bias.data = bias[offset : offset + rows]
            offset += rows
    return weight, bias


def is_fused(fused: FusedLinear | None, first: nn.Linear) -> bool:
    """Whether `fused` still backs `first` (a `.to()` re-allocates parameters)."""
    return fused is not None and fused[0].data_ptr() == first.weight.data_ptr()


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        bias = spec.has_mlp_bias
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=bias)
        self._gate_up: FusedLinear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def gate_up_weights(self) -> FusedLinear:
        """The one gate|up weight (and bias) the fast path multiplies by, built once."""
        if not is_fused(self._gate_up, self.gate_proj):
            self._gate_up = fuse_linears([self.gate_proj, self.up_proj])
        return self._gate_up  # type: ignore[return-value]


class PagedSelfAttention(nn.Module):
    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.scale = spec.head_dim**-0.5
        q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        bias = spec.has_attention_bias
        self.q_proj = nn.Linear(spec.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(spec.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(spec.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, bias=bias)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.has_qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.has_qk_norm else None
        self._qkv: FusedLinear | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """x: [num_tokens, hidden]; cos/sin: [num_tokens, head_dim] -> [num_tokens, hidden]."""
        num_tokens = x.shape[0]
        query = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        key = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        value = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        write_kv(k_cache, v_cache, key, value, meta.slot_mapping)
        out = attend(query, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def qkv_weights(self) -> FusedLinear:
        """The one q|k|v weight (and bias) the fast path multiplies by, built once."""
        if not is_fused(self._qkv, self.q_proj):
            self._qkv = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        return self._qkv  # type: ignore[return-value]

    def qk_norm_weights(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """(q weight, k weight, eps) of the per-head q/k RMSNorm (Qwen3), None without one."""
        if self.q_norm is None or self.k_norm is None:
            return None
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps

    def attend_rotated(
        self,
        query: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        linear: LinearFn = F.linear,
    ) -> torch.Tensor:
        """The fast path after q|k|v, RoPE and the KV write (`fused_linears.norm_qkv_rope`).
        query: [num_tokens, heads, head_dim] (any row stride) -> [num_tokens, hidden]."""
        out = attend(query, k_cache, v_cache, meta, self.scale)
        out = out.view(query.shape[0], self.num_heads * self.head_dim)
        return linear(out, self.o_proj.weight, self.o_proj.bias)


class DecoderLayer(nn.Module):
    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        self.self_attn = PagedSelfAttention(spec)
        self.mlp = GatedMLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """x: [num_tokens, hidden] residual stream in and out."""
        attn = self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBackbone(nn.Module):
    """Embedding table, layers and final norm; no head (callers own it)."""

    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta)
        self.gemv_backend = "cublas"  # the fast path's matmuls: see set_gemv_backend

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
    ) -> torch.Tensor:
        """embeds: [num_tokens, hidden]; positions: [num_tokens] int64 -> [num_tokens, hidden]
        post-norm hidden states."""
        if meta.backend == "triton":
            return self._forward_fused(embeds, positions, meta, kv)
        cos, sin = self.rotary.cos_sin(positions, embeds.dtype)
        x = embeds
        for layer_idx, layer in enumerate(self.layers):
            x = layer(x, cos, sin, meta, kv.key_cache(layer_idx), kv.value_cache(layer_idx))
        return self.norm(x)

    def head_logits(self, head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, out] float32 logits: on the Triton GEMV straight from the kernel."""
        if self.gemv_backend != "triton":
            return head(hidden).to(torch.float32)
        from backends.runner.triton_gemv import skinny_linear

        return skinny_linear(hidden, head.weight, head.bias, out_dtype=torch.float32)

    def _forward_fused(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
    ) -> torch.Tensor:
        """The fast path: each norm fused with the residual add before it and, on the Triton
        GEMV at decode sizes, into the matmul after it where measured faster (SwiGLU too; RoPE
        and the KV write into the q|k|v matmul's epilogue where it fits)."""
        from backends.runner.fused_linears import norm_linear, norm_qkv_rope, silu_linear
        from backends.runner.gemv_rope import RopeEpilogue
        from backends.runner.triton_gemv import linear_for
        from backends.runner.triton_layer_ops import rms_norm

        backend = self.gemv_backend
        linear = linear_for(backend)
        stream, branch = embeds, None  # the residual stream, and the branch output to add to it
        for layer_idx, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            k_cache, v_cache = kv.key_cache(layer_idx), kv.value_cache(layer_idx)
            rope = RopeEpilogue(positions, self.rotary.inv_freq, meta.slot_mapping, k_cache,
                                v_cache, attn.num_heads)  # fmt: skip
            norm = layer.input_layernorm
            query, stream = norm_qkv_rope(branch, stream, norm.weight, norm.eps, attn.qkv_weights(),
                                          backend, rope, attn.qk_norm_weights())  # fmt: skip
            branch = attn.attend_rotated(query, meta, k_cache, v_cache, linear)
            norm = layer.post_attention_layernorm
            gate_up, stream = norm_linear(
                branch, stream, norm.weight, norm.eps, *mlp.gate_up_weights(), backend
            )
            branch = silu_linear(gate_up, mlp.down_proj.weight, mlp.down_proj.bias, backend)
        normed, _ = rms_norm(branch, self.norm.weight, self.norm.eps, residual=stream)
        return normed


def set_gemv_backend(model: nn.Module, backend: str) -> None:
    """Route the fast path's matmuls of every backbone in `model` (and its `head_logits`) to
    `backend`: "cublas" (F.linear) or "triton" (skinny_linear)."""
    if backend not in ("cublas", "triton"):
        raise ValueError(f"gemv backend must be 'cublas' or 'triton', got {backend!r}")
    for module in model.modules() if isinstance(model, nn.Module) else ():
        if isinstance(module, DecoderBackbone):
            module.gemv_backend = backend
