"""Tests for backends/checkpoint/loader.py.

Strategy: the tiny checkpoint is the fixture. Round-trip: every tensor read back per prefix
equals the generator's state dict exactly, and the transformers classes the real checkpoint
was trained as load their prefix strictly. Rejections: copies of the tiny directory with
one defect each must fail at load with a message naming that defect.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3ForCausalLM, WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from backends.checkpoint.loader import REQUIRED_WEIGHT_PREFIXES, CheckpointError, load_checkpoint
from backends.checkpoint.tiny_weights import tiny_state_dict
from backends.checkpoint.weight_shards import INDEX_FILE, SINGLE_FILE


def test_weights_round_trip_exactly(tiny_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_dir)
    written = tiny_state_dict(checkpoint.config, seed=0)
    read = {p + k: v for p in REQUIRED_WEIGHT_PREFIXES for k, v in checkpoint.weights(p).items()}
    assert sorted(read) == sorted(written)
    unequal = [k for k in written if not torch.equal(read[k], written[k])]
    assert unequal == []


def test_thinker_llm_loads_strictly_into_qwen3(tiny_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_dir)
    llm = checkpoint.config.llm
    model = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=llm.hidden_size, num_hidden_layers=llm.num_hidden_layers,
        num_attention_heads=llm.num_attention_heads, num_key_value_heads=llm.num_key_value_heads,
        head_dim=llm.head_dim, intermediate_size=llm.intermediate_size, vocab_size=llm.vocab_size,
        tie_word_embeddings=False,
    ))
    model.load_state_dict(checkpoint.weights("llm."), strict=True)
    assert checkpoint.weights("llm").keys() == checkpoint.weights("llm.").keys()


def test_encoder_and_talker_backbone_load_strictly(tiny_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_dir)
    audio, tts = checkpoint.config.audio, checkpoint.config.tts
    WhisperEncoder(WhisperConfig(
        d_model=audio.d_model, encoder_layers=audio.encoder_layers,
        encoder_attention_heads=audio.encoder_attention_heads, encoder_ffn_dim=audio.encoder_ffn_dim,
        num_mel_bins=audio.num_mel_bins, max_source_positions=audio.max_source_positions,
    )).load_state_dict(checkpoint.weights("apm."), strict=True)
    backbone = checkpoint.weights("tts.model.")
    LlamaModel(LlamaConfig(
        hidden_size=tts.hidden_size, num_hidden_layers=tts.num_hidden_layers,
        num_attention_heads=tts.num_attention_heads, num_key_value_heads=tts.num_key_value_heads,
        intermediate_size=tts.intermediate_size, vocab_size=backbone["embed_tokens.weight"].shape[0],
    )).load_state_dict(backbone, strict=True)


def test_talker_tables_have_the_real_shapes(tiny_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_dir)
    tts = checkpoint.config.tts
    shapes = {k: tuple(v.shape) for k, v in checkpoint.weights("tts.").items() if not k.startswith("model.")}
    assert shapes == {
        "emb_text.weight": (tts.num_text_tokens, 64),
        "emb_code.0.weight": (6562, 64),
        "projector_semantic.linear1.weight": (64, 64), "projector_semantic.linear1.bias": (64,),
        "projector_semantic.linear2.weight": (64, 64), "projector_semantic.linear2.bias": (64,),
        "head_code.0.parametrizations.weight.original0": (6562, 1),
        "head_code.0.parametrizations.weight.original1": (6562, 64),
    }
    projector = checkpoint.weights("audio_projection_layer.")
    assert projector["linear1.weight"].shape == (64, checkpoint.config.audio.projector_in_dim)


def test_tokenizer_and_assets_are_exposed(tiny_dir: Path) -> None:
    checkpoint = load_checkpoint(tiny_dir)
    assert checkpoint.is_tiny
    assert checkpoint.special_tokens.unit == checkpoint.tokenizer.token_to_id("<unit>")
    assert checkpoint.tokenizer.vocab_size == checkpoint.config.llm.vocab_size
    tts = checkpoint.config.tts
    assert checkpoint.tokenizer.id_to_token(tts.audio_bos_token_id) == "<|audio_bos|>"
    assert (checkpoint.token2wav_dir / "flow.yaml").is_file()
    voice, rate = checkpoint.reference_voice()
    assert voice.dtype == np.float32 and rate == 16000 and voice.size / rate == pytest.approx(6.016)


def test_unknown_prefixes_are_ignored_but_readable(tiny_copy: Path) -> None:
    save_file({"vpm.w": torch.ones(2), "resampler.q": torch.zeros(3)}, str(tiny_copy / "extra.safetensors"))
    index = json.loads((tiny_copy / INDEX_FILE).read_text())
    index["weight_map"].update({"vpm.w": "extra.safetensors", "resampler.q": "extra.safetensors"})
    (tiny_copy / INDEX_FILE).write_text(json.dumps(index))
    checkpoint = load_checkpoint(tiny_copy)
    assert torch.equal(checkpoint.weights("vpm.")["w"], torch.ones(2))
    with pytest.raises(CheckpointError, match=r"no weights under prefix 'nothing\.'.*apm\., "):
        checkpoint.weights("nothing")


def test_single_file_checkpoint_loads(tiny_copy: Path) -> None:
    checkpoint = load_checkpoint(tiny_copy)
    save_file(checkpoint.weight_index.load(""), str(tiny_copy / SINGLE_FILE))
    (tiny_copy / INDEX_FILE).unlink()
    for shard in tiny_copy.glob("model-*.safetensors"):
        shard.unlink()
    assert load_checkpoint(tiny_copy).weights("tts.head_code.0").keys() == {
        "parametrizations.weight.original0", "parametrizations.weight.original1"}


def _edit_json(file: Path, edit: Callable[[Any], object]) -> None:
    data = json.loads(file.read_text())
    edit(data)
    file.write_text(json.dumps(data))


def _drop_prefix(index: dict, prefix: str) -> None:
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(prefix)}


def _drop_added_token(tokenizer: dict, token: str) -> None:
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != token]


@pytest.mark.parametrize(("defect", "message"), [
    ("config_key", r"tts\.emb_code\.0\.weight is \[6562, 64\] but config\.json "
                   r"\('tts_config\.num_audio_tokens', 'tts_config\.hidden_size'\) gives \[4097, 64\]"),
    ("mel_bins", r"apm\.conv1\.weight is \[64, 80, 3\] but .*gives \[64, 128, 3\]"),
    ("token2wav", r"missing assets/token2wav/flow\.pt, assets/token2wav/hift\.pt"),
    ("voice", r"missing assets/HT_ref_audio\.wav"),
    ("version", "unsupported MiniCPM-o version '2.6'"),
    ("no_config", "missing config.json"),
    ("no_tokenizer", "missing tokenizer"),
    ("special_token", r"lacks required special tokens: <\|speak\|>"),
    ("head_code", r"missing weights tts\.head_code\.0\.\*"),
    ("llm_and_apm", r"missing weights llm\.\*, apm\.\*"),
    ("shard", "missing weight shards listed in .*model-00002-of-00004"),
    ("no_weights", "missing weights: neither"),
])
def test_broken_checkpoints_are_rejected(tiny_copy: Path, defect: str, message: str) -> None:
    config, index = tiny_copy / "config.json", tiny_copy / INDEX_FILE
    damage = {
        "config_key": lambda: _edit_json(config, lambda d: d["tts_config"].pop("num_audio_tokens")),
        "mel_bins": lambda: _edit_json(config, lambda d: d["audio_config"].update(num_mel_bins=128)),
        "token2wav": lambda: [(tiny_copy / "assets/token2wav" / n).unlink() for n in ("flow.pt", "hift.pt")],
        "voice": lambda: (tiny_copy / "assets/HT_ref_audio.wav").unlink(),
        "version": lambda: _edit_json(config, lambda d: d.update(version="2.6")),
        "no_config": lambda: config.unlink(),
        "no_tokenizer": lambda: (tiny_copy / "tokenizer.json").unlink(),
        "special_token": lambda: _edit_json(tiny_copy / "tokenizer.json",
                                            lambda d: _drop_added_token(d, "<|speak|>")),
        "head_code": lambda: _edit_json(index, lambda d: _drop_prefix(d, "tts.head_code.0.")),
        "llm_and_apm": lambda: _edit_json(index, lambda d: (_drop_prefix(d, "llm."), _drop_prefix(d, "apm."))),
        "shard": lambda: (tiny_copy / "model-00002-of-00004.safetensors").unlink(),
        "no_weights": lambda: index.unlink(),
    }
    damage[defect]()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tiny_copy)


def test_special_ids_beyond_the_vocabulary_are_rejected(tiny_copy: Path) -> None:
    _edit_json(tiny_copy / "config.json", lambda d: d.update(vocab_size=900))
    with pytest.raises(CheckpointError, match=r"outside the Thinker vocabulary \(vocab_size 900\)"):
        load_checkpoint(tiny_copy)


def test_missing_directory_and_voice_are_named(tiny_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent")
    checkpoint = load_checkpoint(tiny_copy)
    (tiny_copy / "assets" / "HT_ref_audio.wav").unlink()  # removed after the load
    with pytest.raises(CheckpointError, match="missing default reference voice"):
        checkpoint.reference_voice()
