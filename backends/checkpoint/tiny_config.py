"""config.json of the tiny checkpoint: the real MiniCPM-o 4.5 key set at tiny widths.

Vision keys are placeholders (the duplex path here is audio-only), present so that code
reading a real config sees the same keys. `_tiny` marks the directory as generated, with the
seed and the generator format, so a stale or foreign directory is never mistaken for it.
"""

from __future__ import annotations

from typing import Any

TINY_FORMAT = 2  # bump whenever generated content changes, so cached tiny dirs regenerate
TINY_MARKER_KEY = "_tiny"
TINY_HIDDEN = 64
TINY_INTERMEDIATE = 192
TINY_TALKER_BACKBONE_VOCAB = 256  # real 32000; the table is never used, so keep it small
NUM_AUDIO_TOKENS = 6562  # real codec vocabulary: 6561 speech codes + EOS


def tiny_marker(seed: int) -> dict[str, int]:
    return {"seed": seed, "format": TINY_FORMAT}


def tiny_config_dict(vocab_size: int, audio_bos_token_id: int, text_eos_token_id: int,
                     eos_token_id: int, seed: int) -> dict[str, Any]:
    """The full config.json object; token ids come from the tiny tokenizer."""
    return {
        "_name_or_path": "minicpmo-4_5-tiny",
        TINY_MARKER_KEY: tiny_marker(seed),
        "architectures": ["MiniCPMO"],
        "model_type": "minicpmo",
        "version": "4.5",
        "torch_dtype": "float32",
        **_thinker_fields(vocab_size, eos_token_id),
        **_vision_placeholders(),
        "init_audio": True,
        "init_tts": True,
        "audio_pool_step": 5,
        "audio_chunk_length": 1.0,
        "audio_config": _audio_config(),
        "tts_config": _tts_config(vocab_size, audio_bos_token_id, text_eos_token_id),
    }


def _thinker_fields(vocab_size: int, eos_token_id: int) -> dict[str, Any]:
    return {
        "hidden_size": TINY_HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": TINY_INTERMEDIATE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "vocab_size": vocab_size,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
    }


def _vision_placeholders() -> dict[str, Any]:
    return {
        "init_vision": False,
        "query_num": 64,
        "image_size": 448,
        "patch_size": 14,
        "drop_vision_last_layer": False,
        "batch_vision_input": True,
        "slice_mode": True,
        "slice_config": {"patch_size": 14, "max_slice_nums": 9, "scale_resolution": 448,
                         "model_type": "minicpmv"},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 980, "patch_size": 14,
                          "model_type": "siglip_vision_model"},
    }


def _audio_config() -> dict[str, Any]:
    return {
        "model_type": "whisper",
        "d_model": TINY_HIDDEN,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 256,  # // 4 = 64 = the audio projector's input width
        "num_mel_bins": 80,
        "max_source_positions": 1500,
        "activation_function": "gelu",
        "scale_embedding": False,
    }


def _tts_config(vocab_size: int, audio_bos_token_id: int, text_eos_token_id: int) -> dict[str, Any]:
    return {
        "model_type": "minicpmtts",
        "llm_dim": TINY_HIDDEN,
        "hidden_size": TINY_HIDDEN,
        "intermediate_size": TINY_INTERMEDIATE,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "max_position_embeddings": 4096,
        "num_audio_tokens": NUM_AUDIO_TOKENS,
        "num_text_tokens": vocab_size,  # emb_text is indexed by Thinker token ids
        "num_vq": 1,
        "audio_bos_token_id": audio_bos_token_id,
        "text_eos_token_id": text_eos_token_id,
        "normalize_projected_hidden": True,
        "attention_type": "full_attention",
        "window_size": 2,
        "condition_type": "hidden_text_merge",
        "backbone_model": "llama",
        "backbone_vocab_size": TINY_TALKER_BACKBONE_VOCAB,
        "projector_type": "mlp",
        "hidden_act": "silu",
    }
