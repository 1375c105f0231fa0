"""Qwen3 causal LM (the Thinker's language backbone) over the runner's paged KV cache.

Parameter names equal transformers' `Qwen3ForCausalLM` (`model.embed_tokens.weight`,
`model.layers.N.self_attn.q_norm.weight`, `model.norm.weight`, `lm_head.weight`), so the
checkpoint's `llm.*` tensors load with the prefix stripped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from backends.models.decoder_backbone import BackboneSpec, DecoderBackbone, require_positive, set_gemv_backend
from backends.runner.attention import AttentionMetadata
from backends.runner.kv_cache import KVCache
from backends.runner.rope import RotaryEmbedding


@dataclass(frozen=True, slots=True)
class Qwen3Config:
    """The HF config fields the decoder uses, under HF's names."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960

    def __post_init__(self) -> None:
        require_positive("Qwen3Config", asdict(self))
        self.to_spec()  # checks the head geometry

    def to_spec(self) -> BackboneSpec:
        return BackboneSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            has_qk_norm=True,
        )


class Qwen3ForCausalLM(nn.Module):
    """DecoderModel: Qwen3 backbone (`model`) + untied `lm_head`."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderBackbone(config.to_spec())
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim

    @property
    def rotary(self) -> RotaryEmbedding:
        return self.model.rotary

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: [n] int64 -> [n, hidden_size]."""
        return self.model.embed_tokens(token_ids)

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
    ) -> torch.Tensor:
        """embeds: [num_tokens, hidden]; positions: [num_tokens] int64 -> [num_tokens, hidden]."""
        return self.model(embeds, positions, meta, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> [n, vocab_size] float32."""
        return self.model.head_logits(self.lm_head, hidden)

    def set_gemv_backend(self, backend: str) -> None:
        """Route the matmuls of the backbone inside to the runner's `backend`."""
        set_gemv_backend(self, backend)
