"""Tests for backends/checkpoint/config.py.

Strategy: parse the tiny generator's config dict (the real key set) and derive broken variants
from it in Python, one defect each; every rejection must name the JSON key or value at fault.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from backends.checkpoint.config import MiniCPMOConfig
from backends.checkpoint.tiny_config import tiny_config_dict


def _raw() -> dict[str, Any]:
    return tiny_config_dict(vocab_size=1000, audio_bos_token_id=998, text_eos_token_id=999,
                            eos_token_id=978, seed=0)


def _without(raw: dict[str, Any], dotted: str) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    *parents, key = dotted.split(".")
    node = raw
    for p in parents:
        node = node[p]
    del node[key]
    return raw


def _with(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    *parents, key = dotted.split(".")
    node = raw
    for p in parents:
        node = node[p]
    node[key] = value
    return raw


def test_tiny_config_parses_into_sections() -> None:
    config = MiniCPMOConfig.from_dict(_raw())
    assert config.version == "4.5"
    assert (config.llm.hidden_size, config.llm.num_key_value_heads, config.llm.head_dim) == (64, 2, 16)
    assert config.llm.rope_theta == 1e6 and config.llm.attention_bias is False
    assert (config.audio.d_model, config.audio.encoder_ffn_dim, config.audio.projector_in_dim) == (64, 256, 64)
    assert (config.audio_pool_step, config.audio_chunk_length) == (5, 1.0)
    assert (config.tts.num_audio_tokens, config.tts.eos_code, config.tts.head_dim) == (6562, 6561, 16)
    assert (config.tts.audio_bos_token_id, config.tts.text_eos_token_id) == (998, 999)
    assert config.raw["query_num"] == 64  # unmodelled keys are kept


@pytest.mark.parametrize("version", ["2.6", "4.0", 2.6])
def test_other_versions_are_rejected(version: Any) -> None:
    with pytest.raises(ValueError, match=r"unsupported MiniCPM-o version '2\.6'|'4\.0'"):
        MiniCPMOConfig.from_dict(_with(_raw(), "version", version))


def test_version_as_json_number_is_accepted() -> None:
    assert MiniCPMOConfig.from_dict(_with(_raw(), "version", 4.5)).version == "4.5"


def test_missing_version_reads_as_4_5() -> None:
    """The official 4.5 config class writes no `version` key."""
    assert MiniCPMOConfig.from_dict(_without(_raw(), "version")).version == "4.5"


@pytest.mark.parametrize(("key", "expected"), [
    # Qwen3Config (the top level)
    ("vocab_size", 151936), ("rms_norm_eps", 1e-6), ("rope_theta", 10_000.0),
    ("intermediate_size", 22016), ("max_position_embeddings", 32768), ("head_dim", 128),
    ("audio_pool_step", 5), ("audio_chunk_length", 1.0),
    # WhisperConfig (`audio_config`)
    ("audio_config.num_mel_bins", 80), ("audio_config.d_model", 384),
    ("audio_config.encoder_layers", 4), ("audio_config.max_source_positions", 1500),
    # MiniCPMTTSConfig (`tts_config`)
    ("tts_config.hidden_size", 768), ("tts_config.num_hidden_layers", 20),
    ("tts_config.intermediate_size", 3072), ("tts_config.num_audio_tokens", 4097),
    ("tts_config.window_size", 2), ("tts_config.num_vq", 1),
    ("tts_config.attention_type", "sliding_recompute"),
    ("tts_config.normalize_projected_hidden", False),
])
def test_absent_keys_take_the_official_defaults(key: str, expected: Any) -> None:
    config = MiniCPMOConfig.from_dict(_without(_raw(), key))
    *section, name = key.split(".")
    attr = {"tts_config": config.tts, "audio_config": config.audio}[section[0]] if section else None
    value = getattr(attr, name) if attr else _top_level(config, name)
    assert value == expected


def _top_level(config: MiniCPMOConfig, name: str) -> Any:
    if name in ("audio_pool_step", "audio_chunk_length"):
        return getattr(config, name)
    return getattr(config.llm, name)


def test_absent_sections_take_the_official_defaults() -> None:
    assert MiniCPMOConfig.from_dict(_without(_raw(), "audio_config")).audio.d_model == 384
    # MiniCPMTTSConfig's llm_dim (2560) cannot project a 64-wide Thinker: named, not guessed
    with pytest.raises(ValueError, match=r"'tts_config.llm_dim' \(2560\) must equal"):
        MiniCPMOConfig.from_dict(_without(_raw(), "tts_config"))


def test_kv_heads_default_like_qwen3_config() -> None:
    """Absent: Qwen3Config's 32; an explicit null: as many as the query heads."""
    config = MiniCPMOConfig.from_dict(_with(_raw(), "num_key_value_heads", None))
    assert config.llm.num_key_value_heads == 4
    with pytest.raises(ValueError, match=r"'num_attention_heads' \(4\) must be a multiple"):
        MiniCPMOConfig.from_dict(_without(_raw(), "num_key_value_heads"))


def test_rope_parameters_form_is_read() -> None:
    """transformers >= 5 writes rope_theta inside rope_parameters."""
    raw = _with(_without(_raw(), "rope_theta"), "rope_parameters", {"rope_theta": 5e5, "rope_type": "default"})
    assert MiniCPMOConfig.from_dict(raw).llm.rope_theta == 5e5


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", True, "'hidden_size' must be int"),
    ("tts_config.hidden_size", "64", "'tts_config.hidden_size' must be int"),
    ("audio_config", [], "'audio_config' must be dict"),
    ("num_hidden_layers", 0, "'num_hidden_layers' must be positive"),
    ("num_key_value_heads", 3, "'num_attention_heads' \\(4\\) must be a multiple"),
    ("audio_config.encoder_attention_heads", 3, "'audio_config.d_model' \\(64\\)"),
    ("tts_config.num_vq", 2, "'tts_config.num_vq' must be 1"),
    ("tts_config.audio_bos_token_id", 1000, "'tts_config.audio_bos_token_id' \\(1000\\)"),
    ("tts_config.llm_dim", 32, "'tts_config.llm_dim' \\(32\\) must equal 'hidden_size' \\(64\\)"),
    ("audio_chunk_length", -1.0, "'audio_chunk_length' must be positive"),
])
def test_bad_values_are_named(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MiniCPMOConfig.from_dict(_with(_raw(), key, value))


def test_from_file_reads_directory_and_rejects_bad_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_raw()))
    assert MiniCPMOConfig.from_file(tmp_path).llm.vocab_size == 1000
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        MiniCPMOConfig.from_file(tmp_path)
    with pytest.raises(ValueError, match="missing config.json"):
        MiniCPMOConfig.from_file(tmp_path / "nowhere")
