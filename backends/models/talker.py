"""The Talker: a Llama codec LM conditioned on Thinker tokens + hidden states
(docs/model_facts.md#talker-chunks).

Parameter names equal the checkpoint's `tts.*` keys with the prefix stripped: `model.*` (the
Llama backbone, whose own 32000-row token table is never used), `emb_text`, `emb_code.0`,
`projector_semantic.linear1/linear2`, `head_code.0` (stored weight-normalised, folded at load).
`projector_spk` is in every checkpoint but unused by the duplex path, so it is not loaded.
As a runner `DecoderModel`, its input table is `emb_code[0]` (the previous sampled code is the
next input) and its head is `head_code[0]`; condition rows are injected as embeddings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from backends.models.audio_projector import MultiModalProjector
from backends.models.decoder_backbone import set_gemv_backend
from backends.models.llama import LlamaBackbone, LlamaBackboneConfig
from backends.models.weight_norm import fold_weight_norm_keys
from backends.runner.attention import AttentionMetadata
from backends.runner.host_staging import to_device
from backends.runner.kv_cache import KVCache
from backends.runner.rope import RotaryEmbedding

_CHECKPOINT_PREFIX = "tts."
_HEAD = "head_code."


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    """`tts_config` fields under their config.json names; defaults are MiniCPM-o 4.5's."""

    llm_dim: int = 4096
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    max_position_embeddings: int = 4096
    num_audio_tokens: int = 6562  # 6561 speech codes + EOS
    # emb_text rows, indexed by Thinker token ids (Qwen3's vocab; config.json sets it)
    num_text_tokens: int = 151748
    num_vq: int = 1
    audio_bos_token_id: int = 151687
    text_eos_token_id: int = 151692
    rms_norm_eps: float = 1e-6  # the Llama backbone's built-in value (not in tts_config)
    rope_theta: float = 10_000.0
    backbone_vocab_size: int = 32000  # the backbone's unused token table

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and not value > 0:
                raise ValueError(f"TalkerConfig.{f.name} must be positive, got {value!r}")
        if self.num_vq != 1:
            raise ValueError(f"TalkerConfig.num_vq must be 1, got {self.num_vq}")
        if self.num_audio_tokens < 2:
            raise ValueError(
                f"TalkerConfig.num_audio_tokens must be >= 2, got {self.num_audio_tokens}"
            )
        for name in ("audio_bos_token_id", "text_eos_token_id"):
            if getattr(self, name) >= self.num_text_tokens:
                raise ValueError(
                    f"TalkerConfig.{name}={getattr(self, name)} is outside emb_text "
                    f"(num_text_tokens={self.num_text_tokens})"
                )
        self.backbone_config()  # checks the head geometry

    @property
    def eos_id(self) -> int:
        return self.num_audio_tokens - 1

    @classmethod
    def from_dict(cls, tts_config: Mapping[str, Any]) -> TalkerConfig:
        """From a config.json `tts_config` mapping; keys this model does not use are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in tts_config.items() if k in names})

    def backbone_config(self) -> LlamaBackboneConfig:
        return LlamaBackboneConfig(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.backbone_vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
        )


class TalkerModel(nn.Module):
    """DecoderModel for the runner plus `condition_embeds` for Thinker handoffs."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.model = LlamaBackbone(config.backbone_config())
        self.emb_text = nn.Embedding(config.num_text_tokens, hidden)
        self.emb_code = nn.ModuleList([nn.Embedding(config.num_audio_tokens, hidden)])
        self.projector_semantic = MultiModalProjector(config.llm_dim, hidden)
        self.head_code = nn.ModuleList([nn.Linear(hidden, config.num_audio_tokens, bias=False)])
        spec = self.model.spec
        self.hidden_size = spec.hidden_size
        self.num_layers = spec.num_layers
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim

    @property
    def rotary(self) -> RotaryEmbedding:
        return self.model.rotary

    def condition_embeds(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """token_ids: [n] int64 Thinker ids, hidden: [n, llm_dim] float32 Thinker rows ->
        [n + 1, hidden_size] in the model dtype: emb_text(t) + L2norm(projector(h)) per row,
        then one emb_text(audio_bos) row (the duplex `generate_chunk` layout)."""
        return self.condition_embeds_many(token_ids, hidden, [token_ids.numel()])[0]

    def condition_embeds_many(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, counts: list[int]
    ) -> list[torch.Tensor]:
        """Several conditions' `condition_embeds` in one pass (a launch-bound handful of
        kernels, not one handful per condition). token_ids/hidden: every condition's rows back
        to back ([sum n] and [sum n, llm_dim]); counts: n per condition -> one [n + 1,
        hidden_size] view per condition."""
        rows = self._condition_rows(token_ids, hidden)
        bos = self.config.audio_bos_token_id  # its table row as a view: no id tensor to copy in
        table = torch.cat([rows, self.emb_text.weight[bos : bos + 1]], dim=0)
        order = to_device(condition_order(counts), table.device)
        return list(table.index_select(0, order).split([n + 1 for n in counts]))

    def _condition_rows(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[n] ids, [n, llm_dim] float32 -> [n, hidden_size]: emb_text + L2norm(projector).

        Always normalised: the official duplex path (`_convert_results_to_tts_input`) does so
        whatever the config's `normalize_projected_hidden` says."""
        num = token_ids.shape[0] if token_ids.dim() == 1 else -1
        if num < 0 or tuple(hidden.shape) != (num, self.config.llm_dim):
            raise ValueError(
                f"condition needs token_ids [n] and hidden [n, {self.config.llm_dim}], got "
                f"{tuple(token_ids.shape)} and {tuple(hidden.shape)}"
            )
        projected = self.projector_semantic(hidden.to(self.emb_text.weight.dtype))
        projected = F.normalize(projected, p=2, dim=-1)
        return self.emb_text(token_ids) + projected

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: [n] int64 codec ids -> [n, hidden_size] (emb_code[0], never the
        backbone's token table)."""
        return self.emb_code[0](token_ids)

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
        """hidden: [n, hidden_size] -> [n, num_audio_tokens] float32."""
        return self.model.head_logits(self.head_code[0], hidden)

    def set_gemv_backend(self, backend: str) -> None:
        """Route the matmuls of the backbone inside to the runner's `backend`."""
        set_gemv_backend(self, backend)


def condition_order(counts: list[int]) -> np.ndarray:
    """[sum n + len(counts)] int64: each condition's rows of the stacked [rows; audio_bos]
    table of `TalkerModel.condition_embeds_many`, then the bos row (index sum n)."""
    total, starts = sum(counts), np.cumsum([0, *counts[:-1]], dtype=np.int64)
    return np.concatenate(
        [np.append(np.arange(s, s + n, dtype=np.int64), total) for s, n in zip(starts, counts)]
    )


def load_talker_weights(model: TalkerModel, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Load `tts.*` tensors (prefix optional) into `model`, folding the weight-normalised head.

    Raises ValueError naming every missing key (and any shape mismatch); returns the sorted
    keys the model does not use, for the caller to log.
    """
    stripped = {k.removeprefix(_CHECKPOINT_PREFIX): v for k, v in state_dict.items()}
    # The head is folded from float32 g and v: folding bf16 shards into bf16 would round the
    # weight once more than the official computes it (it runs the norm in the model's dtype).
    folded = fold_weight_norm_keys({k: v.float() if k.startswith(_HEAD) else v
                                    for k, v in stripped.items()})
    expected = model.state_dict()
    missing = sorted(set(expected) - set(folded))
    if missing:
        raise ValueError(f"talker weights are missing {len(missing)} keys: {', '.join(missing)}")
    mismatched = [
        f"{k} {tuple(folded[k].shape)} != {tuple(t.shape)}"
        for k, t in expected.items() if folded[k].shape != t.shape
    ]
    if mismatched:
        raise ValueError(f"talker weight shapes do not match: {'; '.join(mismatched)}")
    model.load_state_dict({k: folded[k] for k in expected}, strict=True)
    return sorted(set(folded) - set(expected))
