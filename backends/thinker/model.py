"""The Thinker's weights: the Qwen3 language model (`llm.*`) and the shared audio tower
(`apm.*`, `audio_projection_layer.*`). Per-session state lives elsewhere (the runner's KV and
`StreamingAudioEncoder`), so one `ThinkerModel` serves every session of a stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.config import LlmConfig, MiniCPMOConfig
from backends.checkpoint.loader import Checkpoint
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.models.whisper_encoder import WhisperEncoderConfig

LLM_PREFIX = "llm."
AUDIO_PREFIXES = ("apm.", "audio_projection_layer.")


@dataclass(frozen=True, slots=True)
class ThinkerModel:
    llm: Qwen3ForCausalLM
    audio_encoder: AudioEncoderModel

    @classmethod
    def from_config(
        cls, config: MiniCPMOConfig, device: torch.device | str, dtype: torch.dtype
    ) -> ThinkerModel:
        """Randomly initialised (the full-random profile), in eval mode on `device`."""
        if config.llm.attention_bias:
            raise ValueError("attention_bias=true selects the Qwen2 backbone, not MiniCPM-o 4.5")
        # Built on the target device: a full-size float32 init on the host would take minutes.
        with torch.device(device):
            llm = Qwen3ForCausalLM(qwen3_config(config.llm))
        audio = AudioEncoderModel.from_config(
            WhisperEncoderConfig.from_dict(_audio_fields(config)),
            config.llm.hidden_size,
            pool_step=config.audio_pool_step,
            dtype=dtype,
            device=device,
        )
        return cls(llm.to(dtype=dtype).eval(), audio)

    @classmethod
    def from_checkpoint(
        cls, ckpt: Checkpoint, device: torch.device | str, dtype: torch.dtype
    ) -> ThinkerModel:
        """The Thinker of a checkpoint directory (tiny or real), cast to `dtype`."""
        model = cls.from_config(ckpt.config, device, dtype)
        model.load_llm(ckpt.weights(LLM_PREFIX), ckpt.config.llm.tie_word_embeddings)
        audio_state = {
            prefix + key: tensor
            for prefix in AUDIO_PREFIXES
            for key, tensor in ckpt.weights(prefix).items()
        }
        model.audio_encoder.load_weights(audio_state)
        return model

    def load_llm(self, state: dict[str, torch.Tensor], tie_word_embeddings: bool) -> None:
        """Load `llm.*` tensors (keys without the prefix); a tied head may omit lm_head."""
        state = dict(state)
        if tie_word_embeddings and "lm_head.weight" not in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        expected = set(self.llm.state_dict())
        missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
        if missing or unexpected:
            raise ValueError(
                f"llm weights do not match the Qwen3 model: missing {missing[:8]}, "
                f"unexpected {unexpected[:8]}"
            )
        try:
            self.llm.load_state_dict(state, strict=True)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"llm weights do not fit the Qwen3 model: {err}") from err


def qwen3_config(llm: LlmConfig) -> Qwen3Config:
    return Qwen3Config(
        hidden_size=llm.hidden_size,
        num_hidden_layers=llm.num_hidden_layers,
        num_attention_heads=llm.num_attention_heads,
        num_key_value_heads=llm.num_key_value_heads,
        head_dim=llm.head_dim,
        intermediate_size=llm.intermediate_size,
        vocab_size=llm.vocab_size,
        rms_norm_eps=llm.rms_norm_eps,
        rope_theta=llm.rope_theta,
        max_position_embeddings=llm.max_position_embeddings,
    )


def _audio_fields(config: MiniCPMOConfig) -> dict[str, int]:
    audio = config.audio
    return {
        "d_model": audio.d_model,
        "encoder_layers": audio.encoder_layers,
        "encoder_attention_heads": audio.encoder_attention_heads,
        "encoder_ffn_dim": audio.encoder_ffn_dim,
        "num_mel_bins": audio.num_mel_bins,
        "max_source_positions": audio.max_source_positions,
    }
