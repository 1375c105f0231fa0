"""The `full-random` checkpoint: MiniCPM-o 4.5 at its real dimensions, random weights, no files.

For GPU benchmarks: latency and memory are those of the real model (Qwen3-8B Thinker,
Whisper-medium encoder, 20 x 768 Talker, token2wav at its real sizes), while nothing is read
from disk. Weights are drawn on the target device (a full-size float32 init on the host takes
minutes) with the tiny checkpoint's scale (normal, std 0.02; norms at one; biases zero).

Text goes through the tiny checkpoint's tokenizer, trained in memory (it is a pure function
of the bundled corpus), so the special tokens resolve by string as with any checkpoint. The
Thinker's vocabulary stays the released model's 151748 rows (the official tokenizer's ids,
which size both the LM head and the Talker's `emb_text`); ids past the tokenizer are never
sampled (the Thinker engine masks ids >= tokenizer.vocab_size). The Talker holds what the
duplex path uses: the released checkpoint's `projector_spk` is not loaded, so it is not here
either (tests/official compares every tensor's shape with the official classes').

Its Thinker is built by `ThinkerModel.from_full_random` (backends/thinker/model.py), beside the
Thinker's other constructors; the Talker and token2wav are built here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from backends.checkpoint.config import MiniCPMOConfig
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer

if TYPE_CHECKING:
    from backends.models.talker import TalkerModel
    from backends.models.token2wav import Token2Wav, Token2WavConfig

FULL_RANDOM_SEED = 0
QWEN3_8B = MappingProxyType({  # Thinker backbone (docs/model_facts.md#sizes)
    "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "vocab_size": 151748,
    "max_position_embeddings": 40960, "attention_bias": False, "tie_word_embeddings": False,
})
WHISPER_MEDIUM = MappingProxyType({  # audio encoder (`audio_config`)
    "d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16,
    "encoder_ffn_dim": 4096, "num_mel_bins": 80, "max_source_positions": 1500,
})
# Talker backbone (docs/model_facts.md#sizes): `tts_config`'s Llama 20 x 768, codec vocabulary 6562
TALKER = MappingProxyType({
    "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
    "num_key_value_heads": 12, "num_hidden_layers": 20, "max_position_embeddings": 4096,
    "num_audio_tokens": 6562, "num_vq": 1, "normalize_projected_hidden": True,
    "backbone_vocab_size": 32000,
})


def full_random_config_dict(audio_bos_token_id: int, text_eos_token_id: int) -> dict[str, Any]:
    """config.json content of the full-size model; the two ids come from the tokenizer."""
    return {
        "version": "4.5",
        "model_type": "minicpmo",
        **QWEN3_8B,
        "audio_pool_step": 5,
        "audio_chunk_length": 1.0,
        "audio_config": dict(WHISPER_MEDIUM),
        "tts_config": {
            **TALKER,
            "llm_dim": QWEN3_8B["hidden_size"],
            "num_text_tokens": QWEN3_8B["vocab_size"],  # emb_text is indexed by Thinker ids
            "audio_bos_token_id": audio_bos_token_id,
            "text_eos_token_id": text_eos_token_id,
        },
    }


@dataclass(frozen=True, slots=True)
class FullRandomCheckpoint:
    """What the stage factory needs of a checkpoint, with builders instead of weight files."""

    config: MiniCPMOConfig
    tokenizer: TextTokenizer
    special_tokens: SpecialTokens
    seed: int = FULL_RANDOM_SEED

    def build_talker(self, device: torch.device, dtype: torch.dtype) -> "TalkerModel":
        from backends.models.talker import TalkerConfig, TalkerModel
        from backends.models.materialize import materialize

        with torch.device("meta"):  # structure only: storage is allocated once, on the device
            model = TalkerModel(TalkerConfig.from_dict(self.config.raw["tts_config"]))
        model = model.to(dtype).eval()
        with seeded_rng(device, self.seed + 1):
            materialize(model, device, random_init=True)
        return model

    def build_token2wav(self, device: torch.device) -> "Token2Wav":
        from backends.models.token2wav.assets import random_token2wav

        model = random_token2wav(self.token2wav_config(), self.seed + 2)
        return model.to(device).eval()

    @staticmethod
    def token2wav_config() -> "Token2WavConfig":
        from backends.models.token2wav import Token2WavConfig

        return Token2WavConfig()  # the defaults are the real Step-Audio2 sizes


def full_random_checkpoint(seed: int = FULL_RANDOM_SEED) -> FullRandomCheckpoint:
    """The full-size config with the tiny tokenizer; raises ValueError if they disagree."""
    from backends.checkpoint.tiny_tokenizer import (
        AUDIO_BOS_TOKEN, EOS_TOKEN, TEXT_EOS_TOKEN, train_tiny_tokenizer,
    )

    tokenizer = TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)
    ids = {name: tokenizer.token_to_id(name) for name in (AUDIO_BOS_TOKEN, TEXT_EOS_TOKEN)}
    if None in ids.values():
        raise ValueError(f"the tiny tokenizer lacks {[k for k, v in ids.items() if v is None]}")
    raw = full_random_config_dict(ids[AUDIO_BOS_TOKEN], ids[TEXT_EOS_TOKEN])
    config = MiniCPMOConfig.from_dict(raw)
    if tokenizer.vocab_size > config.llm.vocab_size:
        raise ValueError(f"tokenizer vocabulary {tokenizer.vocab_size} exceeds the Thinker's "
                         f"{config.llm.vocab_size}")
    return FullRandomCheckpoint(config, tokenizer, SpecialTokens.resolve(tokenizer), seed)


@contextmanager
def seeded_rng(device: torch.device, seed: int) -> Iterator[None]:
    """Draws from `seed` on the host and on `device`, leaving their RNG streams as they were."""
    with torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(seed)
        yield


def _rng_devices(device: torch.device) -> list[int]:
    """CUDA devices whose RNG state fork_rng must save and restore."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]
