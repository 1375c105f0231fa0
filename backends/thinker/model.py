"""The Thinker's weights: the Qwen3 language model (`llm.*`) and the shared audio tower
(`apm.*`, `audio_projection_layer.*`). Per-session state lives elsewhere (the runner's KV and
`StreamingAudioEncoder`), so one `ThinkerModel` serves every session of a stage.

Both constructors build on the meta device and allocate once, on the target device and in the
target dtype (backends/models/materialize.py): random weights for `full-random`, storage for
a strict load for a checkpoint. `device="meta"` gives the bare structure (shapes, parameter
count) without memory. A checkpoint whose tensors do not match raises CheckpointError naming
the checkpoint keys that are missing, unexpected or of the wrong shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.config import LlmConfig, MiniCPMOConfig
from backends.checkpoint.full_random import FullRandomCheckpoint, seeded_rng
from backends.checkpoint.loader import Checkpoint, CheckpointError
from backends.models.materialize import materialize
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.models.whisper_encoder import WhisperEncoderConfig

LLM_PREFIX = "llm."
AUDIO_PREFIXES = ("apm.", "audio_projection_layer.")
MAX_NAMED_KEYS = 8  # an error lists this many keys of each kind, then a count


@dataclass(frozen=True, slots=True)
class ThinkerModel:
    llm: Qwen3ForCausalLM
    audio_encoder: AudioEncoderModel

    @classmethod
    def from_config(
        cls, config: MiniCPMOConfig, device: torch.device | str, dtype: torch.dtype
    ) -> ThinkerModel:
        """Random weights (the full-random profile) drawn on `device` in `dtype` from the
        device's default RNG, in eval mode; on "meta", the structure only."""
        return cls._build(config, device, dtype, random_init=True)

    @classmethod
    def from_full_random(
        cls, ckpt: FullRandomCheckpoint, device: torch.device, dtype: torch.dtype
    ) -> ThinkerModel:
        """The `full-random` profile's Thinker: `from_config` drawn from the checkpoint's seed."""
        with seeded_rng(device, ckpt.seed):
            return cls.from_config(ckpt.config, device, dtype)

    @classmethod
    def from_checkpoint(
        cls, ckpt: Checkpoint, device: torch.device | str, dtype: torch.dtype
    ) -> ThinkerModel:
        """The Thinker of a checkpoint directory (tiny or real), cast to `dtype`."""
        model = cls._build(ckpt.config, device, dtype, random_init=False)
        model.load_llm(ckpt.weights(LLM_PREFIX), ckpt.config.llm.tie_word_embeddings)
        audio_state = {
            prefix + key: tensor
            for prefix in AUDIO_PREFIXES
            for key, tensor in ckpt.weights(prefix).items()
        }
        model.load_audio(audio_state)
        return model

    @classmethod
    def _build(
        cls, config: MiniCPMOConfig, device: torch.device | str, dtype: torch.dtype,
        random_init: bool,
    ) -> ThinkerModel:
        if config.llm.attention_bias:
            raise ValueError("attention_bias=true selects the Qwen2 backbone, not MiniCPM-o 4.5")
        with torch.device("meta"):
            llm = Qwen3ForCausalLM(qwen3_config(config.llm))
            audio = AudioEncoderModel(
                WhisperEncoderConfig.from_dict(_audio_fields(config)),
                config.llm.hidden_size,
                pool_step=config.audio_pool_step,
            )
        model = cls(llm.to(dtype).eval(), audio.to(dtype).eval())
        if torch.device(device).type != "meta":
            materialize(model.llm, device, random_init)
            materialize(model.audio_encoder, device, random_init)
        return model

    def load_llm(self, state: dict[str, torch.Tensor], tie_word_embeddings: bool) -> None:
        """Load `llm.*` tensors (keys without the prefix); a tied head may omit lm_head."""
        state = dict(state)
        if tie_word_embeddings and "lm_head.weight" not in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        _load_strict(self.llm, state, LLM_PREFIX)

    def load_audio(self, state: dict[str, torch.Tensor]) -> None:
        """Load the `apm.*` and `audio_projection_layer.*` tensors (keys with their prefix)."""
        _load_strict(self.audio_encoder, state, "")


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


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], prefix: str) -> None:
    """Every parameter from `state`, same shapes; CheckpointError names the checkpoint keys
    (with `prefix`) that are missing, unexpected or mis-shaped, changing nothing then."""
    expected = module.state_dict()
    problems = {
        "missing": sorted(expected.keys() - state.keys()),
        "unexpected": sorted(state.keys() - expected.keys()),
        "wrong shape": sorted(
            f"{key} {tuple(state[key].shape)} != {tuple(expected[key].shape)}"
            for key in expected.keys() & state.keys()
            if state[key].shape != expected[key].shape
        ),
    }
    if any(problems.values()):
        raise CheckpointError(
            f"{type(module).__name__} weights do not match the checkpoint: "
            + "; ".join(_named(kind, keys, prefix) for kind, keys in problems.items() if keys)
        )
    module.load_state_dict(state, strict=True)


def _named(kind: str, keys: list[str], prefix: str) -> str:
    shown = ", ".join(prefix + key for key in keys[:MAX_NAMED_KEYS])
    more = f" and {len(keys) - MAX_NAMED_KEYS} more" if len(keys) > MAX_NAMED_KEYS else ""
    return f"{kind} {len(keys)}: {shown}{more}"


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
