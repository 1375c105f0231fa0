"""Audio tower weights: checkpoint keys in, the same module state out.

Strategy: a checkpoint-keyed mapping is built the way the checkpoint generator writes it
(transformers' WhisperEncoder state dict under `apm.`, the projector under
`audio_projection_layer.`, plus keys of other stages); loading it must reproduce every tensor,
ignore foreign prefixes, and refuse incomplete, unknown or mis-shaped entries with ValueError.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder as HFWhisperEncoder

from backends.audio.encoder_model import AudioEncoderModel
from backends.models.whisper_encoder import WhisperEncoderConfig


def _checkpoint(model: AudioEncoderModel) -> dict[str, torch.Tensor]:
    config = model.apm.config
    hf = HFWhisperEncoder(WhisperConfig(
        d_model=config.d_model, encoder_layers=config.encoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim, num_mel_bins=config.num_mel_bins,
        max_source_positions=config.max_source_positions,
    ))
    state = {f"apm.{k}": v + 0.5 for k, v in hf.state_dict().items()}  # differs from `model`
    for name, value in model.audio_projection_layer.state_dict().items():
        state[f"audio_projection_layer.{name}"] = value + 0.25
    state["llm.model.embed_tokens.weight"] = torch.zeros(3, 3)  # another stage's key
    return state


def test_from_config_and_key_prefixes(tiny_model: AudioEncoderModel) -> None:
    assert not tiny_model.training and tiny_model.llm_hidden_size == 48
    prefixes = {key.split(".")[0] for key in tiny_model.state_dict()}
    assert prefixes == {"apm", "audio_projection_layer"}


def test_load_weights_from_checkpoint_keys(
    make_tiny_model: Callable[[int], AudioEncoderModel],
) -> None:
    model = make_tiny_model(0)
    checkpoint = _checkpoint(model)
    model.load_weights(checkpoint)
    for key, value in model.state_dict().items():
        assert torch.equal(value, checkpoint[key]), key


def test_load_weights_casts_to_the_module_dtype(
    make_tiny_model: Callable[[int], AudioEncoderModel],
) -> None:
    model = make_tiny_model(0).to(torch.bfloat16)
    checkpoint = _checkpoint(model)
    model.load_weights(checkpoint)
    assert model.apm.conv1.weight.dtype == torch.bfloat16
    assert torch.equal(model.apm.conv1.weight, checkpoint["apm.conv1.weight"].to(torch.bfloat16))


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.pop("apm.layers.1.fc2.bias"), "missing"),
    (lambda s: s.update({"apm.layers.0.self_attn.k_proj.bias": torch.zeros(64)}), "unexpected"),
    (lambda s: s.update({"audio_projection_layer.linear1.bias": torch.zeros(7)}), "do not fit"),
])
def test_load_weights_refuses_mismatches(
    make_tiny_model: Callable[[int], AudioEncoderModel],
    edit: Callable[[dict[str, torch.Tensor]], object], match: str,
) -> None:
    model = make_tiny_model(0)
    checkpoint = _checkpoint(model)
    edit(checkpoint)
    with pytest.raises(ValueError, match=match):
        model.load_weights(checkpoint)


def test_embed_shapes(tiny_model: AudioEncoderModel) -> None:
    assert tiny_model.embed(torch.zeros(50, 64)).shape == (10, 48)
    assert tiny_model.embed(torch.zeros(2, 55, 64)).shape == (2, 11, 48)


def test_projector_width_must_match_the_encoder() -> None:
    odd = WhisperEncoderConfig(d_model=64, encoder_layers=1, encoder_attention_heads=4,
                               encoder_ffn_dim=128)
    with pytest.raises(ValueError, match="encoder_ffn_dim // 4"):
        AudioEncoderModel(odd, 48)
