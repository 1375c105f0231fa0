"""The model side of the runner contract: what `ModelRunner` and its graph paths call on a
decoder. The models implement it (backends/models: Qwen3, Llama, Talker); the runner never
imports them."""

from __future__ import annotations

from typing import Protocol

import torch

from backends.runner.attention import AttentionMetadata
from backends.runner.kv_cache import KVCache
from backends.runner.rope import RotaryEmbedding


class DecoderModel(Protocol):
    """A forward over (input embeddings, positions, paged-KV metadata), weights loaded apart.

    `embed_tokens` and `compute_logits` are separate so a stage can inject its own embeddings
    and use its own head (the Talker's `head_code`). `forward` must not read device values
    back to the host: everything it needs on the host is in the metadata's `*_np` mirrors.
    """

    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    rotary: RotaryEmbedding  # used by the runner to re-rotate cached keys on re-anchor

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: [n] int64 -> [n, hidden_size] in the model dtype."""
        ...

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVCache,
    ) -> torch.Tensor:
        """embeds: [num_tokens, hidden_size]; positions: [num_tokens] int64 ->
        [num_tokens, hidden_size] final (post-norm) hidden states. Writes this step's K/V."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> [n, vocab] float32."""
        ...

    def set_gemv_backend(self, backend: str) -> None:
        """Run the fast path's matmuls, the head's included, on `backend`: "cublas" (F.linear)
        or "triton" (the skinny Triton GEMV); the runner sets its `RunnerConfig.gemv_backend`."""
        ...
