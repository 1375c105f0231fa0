"""Llama backbone (the Talker's decoder) and a wrapper that gives it an input table and a head.

`LlamaBackbone`'s parameter names equal transformers' `LlamaModel` (`embed_tokens.weight`,
`layers.N.self_attn.q_proj.weight`, `norm.weight`), so the checkpoint's `tts.model.*` tensors
load with the prefix stripped. The backbone has no head: the Talker brings its own
(`head_code`) and its own input tables (`emb_code`, `emb_text`) through `LlamaWithHead`.
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
class LlamaBackboneConfig:
    """The HF `LlamaConfig` fields the backbone uses, under HF's names."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 4096
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads, as in HF
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        sizes = {k: v for k, v in asdict(self).items() if not isinstance(v, bool)}
        if self.head_dim is None:
            sizes.pop("head_dim")
        require_positive("LlamaBackboneConfig", sizes)
        self.to_spec()  # checks the head geometry

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else (
            self.hidden_size // self.num_attention_heads
        )

    def to_spec(self) -> BackboneSpec:
        return BackboneSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.resolved_head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            has_qk_norm=False,
            has_attention_bias=self.attention_bias,
            has_mlp_bias=self.mlp_bias,
        )


class LlamaBackbone(DecoderBackbone):
    """`LlamaModel`-named embedding table, layers and final norm over the paged KV cache."""

    def __init__(self, config: LlamaBackboneConfig) -> None:
        super().__init__(config.to_spec())
        self.config = config


class LlamaWithHead(nn.Module):
    """DecoderModel: a Llama backbone plus a caller-owned head and (optionally) input table.

    head: any module mapping [n, hidden] -> [n, vocab]; embedding: module mapping [n] int64 ->
    [n, hidden], default the backbone's own `embed_tokens`.
    """

    def __init__(
        self, backbone: LlamaBackbone, head: nn.Module, embedding: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        # Registered only when distinct, so the state dict never holds the table twice.
        self.embedding = embedding
        spec = backbone.spec
        self.hidden_size = spec.hidden_size
        self.num_layers = spec.num_layers
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim

    @property
    def rotary(self) -> RotaryEmbedding:
        return self.backbone.rotary

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: [n] int64 -> [n, hidden_size]."""
        table = self.embedding if self.embedding is not None else self.backbone.embed_tokens
        return table(token_ids)

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
    ) -> torch.Tensor:
        """embeds: [num_tokens, hidden]; positions: [num_tokens] int64 -> [num_tokens, hidden]."""
        return self.backbone(embeds, positions, meta, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> [n, vocab] float32."""
        return self.head(hidden).to(torch.float32)

    def set_gemv_backend(self, backend: str) -> None:
        """Route the matmuls of the backbone inside to the runner's `backend`."""
        set_gemv_backend(self, backend)
