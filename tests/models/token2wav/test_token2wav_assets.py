"""The `assets/token2wav/` files: write, read back, and read the real flow.yaml layout.

Strategy: write assets with a seed, load them, and require the loaded model to decode exactly like
the in-memory random model (so flow.pt, hift.pt and flow.yaml carry everything); check the HiFT
file stores weight-normalised layers the way the reference hift.pt does; parse a hand-written
flow.yaml in the real hyperpyyaml layout (tags, references, unknown keys); and build the full-size
model on the meta device to compare its key names and shapes with
docs/model_facts.md#code2wav-token2wav and with the reference's own full-size modules (a real
flow.pt / hift.pt then loads strictly).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from backends.models.token2wav import (
    StreamWindow,
    Token2Wav,
    Token2WavConfig,
    load_token2wav,
    write_token2wav_assets,
)
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt, read_flow_yaml, weight_normed_state
from stepaudio2_reference import build_full_size_reference, load_reference, missing_reason
from backends.models.token2wav.config import CFMConfig, EncoderConfig, HiFTConfig

# Folding g * v / ||v|| back rounds each HiFT weight by ~1 ulp; through the exp magnitudes and
# the F0 -> phase accumulation that is up to ~1e-5 on the audio (measured). A wrong or missing
# tensor changes it by ~1e-2.
ROUND_TRIP_ATOL = 1e-4
FLOW_TENSORS, FLOW_PARAMETERS, DIT_PARAMETERS = 605, 155_802_352, 114_555_472
HIFT_TENSORS, HIFT_PARAMETERS = 328, 20_821_295
REAL_STYLE_YAML = """\
sample_rate: 24000
spk_embed_dim: 192
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: 512
        output_size: 512
        input_layer: 'linear'
        pre_lookahead_len: 3
        num_blocks: 6
        num_up_blocks: 4
        up_stride: 2
        up_scale_factor: 2
        attention_heads: 8
        pos_enc_layer_type: 'rel_pos_espnet'
        linear_units: 2048
        dropout_rate: 0.1
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token2wav_assets(tmp_path_factory.mktemp("model"), Token2WavConfig.tiny(), seed=3)


def test_layout(assets: Path) -> None:
    assert assets.parts[-2:] == ("assets", "token2wav")
    assert sorted(p.name for p in assets.iterdir()) == ["flow.pt", "flow.yaml", "hift.pt"]
    assert read_flow_yaml(assets / "flow.yaml") == Token2WavConfig.tiny()


def test_loaded_model_decodes_like_the_written_one(assets: Path) -> None:
    loaded, original = load_token2wav(assets), random_token2wav(Token2WavConfig.tiny(), seed=3)
    prompt = random_voice_prompt(0, num_codes=20, mel_offset=0.0)
    codes = np.random.default_rng(0).integers(0, 6561, 28).astype(np.int32)
    audio = []
    for model in (loaded, original):
        stream = model.new_stream(model.prepare_voice(prompt))
        audio.append(model.decode([StreamWindow(stream, codes, False)])[0])
    np.testing.assert_allclose(audio[0], audio[1], atol=ROUND_TRIP_ATOL, rtol=0)


def test_full_size_key_names_and_shapes_are_the_reference_ones() -> None:
    """docs/model_facts.md#code2wav-token2wav: flow.pt holds 605 tensors (155,802,352 parameters),
    hift.pt 328 tensors in the parametrization spelling (20,821,295 parameters). Built on the meta
    device: no memory is allocated."""
    with torch.device("meta"):
        model = Token2Wav(Token2WavConfig())
    flow = model.flow.state_dict()
    assert len(flow) == FLOW_TENSORS
    assert sum(t.numel() for t in flow.values()) == FLOW_PARAMETERS
    assert sum(t.numel() for t in model.flow.decoder.estimator.parameters()) == DIT_PARAMETERS
    hift = weight_normed_state(model)  # g and v per weight-normalised layer, as in hift.pt
    assert len(hift) == HIFT_TENSORS
    assert sum(t.numel() for t in hift.values()) == HIFT_PARAMETERS
    assert flow["decoder.estimator.blocks.15.adaLN_modulation.1.weight"].shape == (4608, 512)
    assert flow["encoder.encoders.5.self_attn.pos_bias_u"].shape == (8, 64)
    assert flow["decoder.estimator.blocks.0.conv.block.6.weight"].shape == (512, 512, 3)


def test_full_size_state_dicts_equal_the_reference_modules() -> None:
    """The reference's own full-size flow and HiFT (meta device) have exactly our keys and
    shapes, so a real flow.pt / hift.pt loads strictly."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    reference = load_reference()
    with torch.device("meta"):
        ours = Token2Wav(Token2WavConfig())
        ref_flow, ref_hift = build_full_size_reference(reference)
    assert _shapes(ours.flow.state_dict()) == _shapes(ref_flow.state_dict())
    assert _shapes(weight_normed_state(ours)) == _shapes(ref_hift.state_dict())


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def test_hift_file_is_weight_normalised_like_the_reference(assets: Path) -> None:
    keys = set(torch.load(assets / "hift.pt", weights_only=True))
    for layer in ("conv_pre", "ups.0", "conv_post", "resblocks.0.convs1.0", "f0_predictor.condnet.8"):
        pair = {f"{layer}.parametrizations.weight.original{i}" for i in (0, 1)}
        assert pair <= keys
        assert f"{layer}.weight" not in keys
    plain = {"source_downs.0.weight", "m_source.l_linear.weight", "f0_predictor.classifier.weight"}
    assert plain <= keys
    flow_keys = set(torch.load(assets / "flow.pt", weights_only=True))
    assert {
        "input_embedding.weight", "encoder.embed.out.0.weight",
        "encoder.pre_lookahead_layer.conv1.weight", "encoder.encoders.0.self_attn.linear_q.weight",
        "encoder.up_layer.conv.weight", "encoder.up_encoders.0.feed_forward.w_1.weight",
        "encoder_proj.weight", "spk_embed_affine_layer.weight",
    } <= flow_keys


def test_generator_prefix_is_accepted(assets: Path, tmp_path: Path) -> None:
    for name in ("flow.yaml", "flow.pt"):
        (tmp_path / name).write_bytes((assets / name).read_bytes())
    state = torch.load(assets / "hift.pt", weights_only=True)
    torch.save({f"generator.{k}": v for k, v in state.items()}, tmp_path / "hift.pt")
    load_token2wav(tmp_path)


def test_missing_tensor_is_named(assets: Path, tmp_path: Path) -> None:
    for name in ("flow.yaml", "hift.pt"):
        (tmp_path / name).write_bytes((assets / name).read_bytes())
    state = torch.load(assets / "flow.pt", weights_only=True)
    del state["encoder_proj.bias"]
    torch.save(state, tmp_path / "flow.pt")
    with pytest.raises(ValueError, match="encoder_proj.bias"):
        load_token2wav(tmp_path)


def test_real_style_yaml_parses_with_real_sizes(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(REAL_STYLE_YAML)
    config = read_flow_yaml(tmp_path / "flow.yaml")
    assert config.flow.encoder == EncoderConfig()  # the real encoder sizes
    assert config.flow.decoder == CFMConfig()  # 16-block DiT, CFG 0.7, 10 steps
    assert config.flow.spk_embed_dim == 192 and config.hift == HiFTConfig()
    assert config.hift.hop_samples == 480 and config.overlap_samples == 3840


def test_bad_yaml_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text("sample_rate: 24000\n")
    with pytest.raises(ValueError, match="flow"):
        read_flow_yaml(tmp_path / "flow.yaml")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: EncoderConfig(output_size=30, attention_heads=4), "attention_heads"),
        (lambda: HiFTConfig(upsample_kernel_sizes=(16, 11)), "upsample_kernel_sizes"),
        (lambda: HiFTConfig(base_channels=12), "base_channels"),
        (lambda: Token2WavConfig(mel_cache_frames=0), "mel_cache_frames"),
    ],
)
def test_config_validation(build: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()  # type: ignore[operator]
