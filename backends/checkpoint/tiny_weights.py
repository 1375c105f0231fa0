"""Random weights for the tiny checkpoint, built from the real module classes.

The Thinker backbone, audio encoder and Talker backbone are the transformers classes the
real checkpoint was trained as (`Qwen3ForCausalLM`, `WhisperEncoder`, `LlamaModel`) with
their default initialisation (normal, std = initializer_range 0.02; norms at one), so
their state dicts have exactly the real key names. The small MiniCPM-specific modules
(projectors, codec tables, weight-normalised codec head) use the same std.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3ForCausalLM, WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from backends.checkpoint.config import AudioConfig, LlmConfig, MiniCPMOConfig, TtsConfig
from backends.checkpoint.tiny_config import TINY_TALKER_BACKBONE_VOCAB

INIT_STD = 0.02  # transformers' initializer_range default, used for every module here


class TwoLayerProjector(nn.Module):
    """Linear -> ReLU -> Linear, both with bias (`audio_projection_layer`, `projector_semantic`)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in_dim] -> [..., out_dim]
        return self.linear2(self.relu(self.linear1(x)))


def tiny_state_dict(config: MiniCPMOConfig, seed: int) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor (float32), keyed with the real prefixes, in a fixed order."""
    # fork_rng: seeding must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = (
            ("llm.", _thinker_llm(config.llm)),
            ("apm.", _audio_encoder(config.audio)),
            ("audio_projection_layer.", _audio_projector(config)),
            ("tts.", _talker(config.tts)),
        )
        state = {f"{prefix}{k}": v for prefix, module in parts
                 for k, v in module.state_dict().items()}
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}


def _thinker_llm(llm: LlmConfig) -> nn.Module:
    return Qwen3ForCausalLM(Qwen3Config(
        hidden_size=llm.hidden_size, num_hidden_layers=llm.num_hidden_layers,
        num_attention_heads=llm.num_attention_heads, num_key_value_heads=llm.num_key_value_heads,
        head_dim=llm.head_dim, intermediate_size=llm.intermediate_size,
        rms_norm_eps=llm.rms_norm_eps, rope_theta=llm.rope_theta, vocab_size=llm.vocab_size,
        max_position_embeddings=llm.max_position_embeddings, attention_bias=llm.attention_bias,
        tie_word_embeddings=llm.tie_word_embeddings, initializer_range=INIT_STD,
    ))


def _audio_encoder(audio: AudioConfig) -> nn.Module:
    return WhisperEncoder(WhisperConfig(
        d_model=audio.d_model, encoder_layers=audio.encoder_layers,
        encoder_attention_heads=audio.encoder_attention_heads,
        encoder_ffn_dim=audio.encoder_ffn_dim, num_mel_bins=audio.num_mel_bins,
        max_source_positions=audio.max_source_positions, init_std=INIT_STD,
    ))


def _audio_projector(config: MiniCPMOConfig) -> nn.Module:
    return _init_small(TwoLayerProjector(config.audio.projector_in_dim, config.llm.hidden_size))


def _talker(tts: TtsConfig) -> nn.Module:
    talker = nn.Module()
    talker.model = LlamaModel(LlamaConfig(
        hidden_size=tts.hidden_size, num_hidden_layers=tts.num_hidden_layers,
        num_attention_heads=tts.num_attention_heads, num_key_value_heads=tts.num_key_value_heads,
        intermediate_size=tts.intermediate_size, max_position_embeddings=tts.max_position_embeddings,
        rms_norm_eps=tts.rms_norm_eps, rope_theta=tts.rope_theta,
        vocab_size=TINY_TALKER_BACKBONE_VOCAB, initializer_range=INIT_STD,
    ))
    talker.emb_text = _init_small(nn.Embedding(tts.num_text_tokens, tts.hidden_size))
    talker.emb_code = nn.ModuleList([_init_small(nn.Embedding(tts.num_audio_tokens, tts.hidden_size))])
    talker.projector_semantic = _init_small(TwoLayerProjector(tts.llm_dim, tts.hidden_size))
    head = _init_small(nn.Linear(tts.hidden_size, tts.num_audio_tokens, bias=False))
    # Stored as weight-norm halves: original0 = g [num_audio_tokens, 1], original1 = v.
    talker.head_code = nn.ModuleList([weight_norm(head, dim=0)])
    return talker


def _init_small(module: nn.Module) -> nn.Module:
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.normal_(sub.weight, std=INIT_STD)
        if isinstance(sub, nn.Linear) and sub.bias is not None:
            nn.init.zeros_(sub.bias)
    return module
