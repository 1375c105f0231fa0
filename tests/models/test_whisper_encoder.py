"""Whisper encoder: parity with transformers, and the streaming path against the whole-clip path.

Strategy: transformers' WhisperEncoder with random weights (every parameter, biases and norms
included, drawn at a scale that keeps activations O(1)) is the reference; its state dict loads
into ours unchanged. The reference only takes the full 3000-frame input, so shorter inputs are
checked against a reference built with a smaller position table. The streaming path is then
checked against our own whole-clip path with the block-causal chunk mask: over the same mel,
chunks with redundancy frames and a KV cache must give the same frames. The cache reset is
checked with a small position table so it happens after a few chunks.
"""

from __future__ import annotations

import pytest
import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder as HFWhisperEncoder

from backends.models.whisper_encoder import (
    WhisperEncoder,
    WhisperEncoderConfig,
    block_causal_mask,
    whisper_sinusoids,
)

# float32 with O(1) activations: different attention kernels and summation orders only.
PARITY_TOLERANCE = 1e-4
TINY = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                            encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=1500)


def _hf_encoder(config: WhisperEncoderConfig, seed: int) -> HFWhisperEncoder:
    hf = HFWhisperEncoder(WhisperConfig(
        d_model=config.d_model, encoder_layers=config.encoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim, num_mel_bins=config.num_mel_bins,
        max_source_positions=config.max_source_positions,
    )).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 1.0 if name.endswith("embed_positions.weight") else 0.1
            offset = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            param.copy_(offset + scale * torch.randn(param.shape, generator=generator))
    return hf


def _ours(hf: HFWhisperEncoder, config: WhisperEncoderConfig) -> WhisperEncoder:
    ours = WhisperEncoder(config).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return ours


def _mel(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair() -> tuple[HFWhisperEncoder, WhisperEncoder]:
    hf = _hf_encoder(TINY, seed=1)
    return hf, _ours(hf, TINY)


def test_parameter_names_equal_transformers(pair: tuple[HFWhisperEncoder, WhisperEncoder]) -> None:
    hf, ours = pair
    assert list(ours.state_dict()) == list(hf.state_dict())
    assert "layers.0.self_attn.k_proj.bias" not in ours.state_dict()


def test_full_clip_equals_transformers(pair: tuple[HFWhisperEncoder, WhisperEncoder]) -> None:
    hf, ours = pair
    mel = _mel(3000)
    with torch.no_grad():
        expected = hf(mel).last_hidden_state
        torch.testing.assert_close(ours(mel), expected, rtol=0, atol=PARITY_TOLERANCE)


def test_short_clip_equals_transformers_with_a_short_table() -> None:
    """A 2 s clip uses positions [0, 100) of the same table; transformers needs a 100-entry one."""
    short = WhisperEncoderConfig(**{**{f: getattr(TINY, f) for f in TINY.__dataclass_fields__},
                                    "max_source_positions": 100})
    hf = _hf_encoder(short, seed=2)
    ours = WhisperEncoder(TINY).eval()
    state = hf.state_dict()
    state["embed_positions.weight"] = torch.cat(
        [state["embed_positions.weight"], torch.zeros(1400, 64)])
    ours.load_state_dict(state, strict=True)
    mel = _mel(200, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(ours(mel), hf(mel).last_hidden_state, rtol=0,
                                   atol=PARITY_TOLERANCE)


def test_default_positions_are_whisper_sinusoids() -> None:
    table = WhisperEncoder(TINY).embed_positions.weight
    assert torch.equal(table, whisper_sinusoids(1500, 64))
    assert torch.equal(table[0], torch.cat([torch.zeros(32), torch.ones(32)]))


def test_block_causal_mask() -> None:
    expected = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(block_causal_mask(5, 2, torch.device("cpu")), expected)


def _stream(ours: WhisperEncoder, mel: torch.Tensor, num_chunks: int) -> list[torch.Tensor]:
    """Cut mel [1, 80, 100 * num_chunks + 2] as the streaming front end does."""
    outputs, cache = [], None
    for k in range(num_chunks):
        prefix = 0 if k == 0 else 2
        chunk = mel[0, :, 100 * k - prefix: 100 * k + 102]
        frames, cache = ours.forward_chunk(chunk, cache, prefix_extra_frames=prefix,
                                           suffix_extra_frames=2)
        assert frames.shape == (50, 64) and cache.length == 50 * (k + 1)
        outputs.append(frames)
    return outputs


def test_streaming_equals_whole_clip_with_chunk_mask(
    pair: tuple[HFWhisperEncoder, WhisperEncoder],
) -> None:
    """Redundancy crop, cache append and position offsets together reproduce the whole clip."""
    _, ours = pair
    mel = _mel(602, seed=4)
    with torch.no_grad():
        expected = ours(mel, chunk_frames=50)[0, :300]
        streamed = torch.cat(_stream(ours, mel, 6))
    torch.testing.assert_close(streamed, expected, rtol=0, atol=PARITY_TOLERANCE)


def test_cache_resets_at_the_position_table_limit() -> None:
    """With a 200-entry table, chunk 3 finds 150 + 52 >= 200: it restarts at position 0 and
    must equal the same chunk encoded on a fresh cache."""
    small = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                 encoder_ffn_dim=256, max_source_positions=200)
    encoder = WhisperEncoder(small).eval()
    mel = _mel(802, seed=5)[0]
    lengths, cache = [], None
    with torch.no_grad():
        for k in range(8):
            prefix = 0 if k == 0 else 2
            chunk = mel[:, 100 * k - prefix: 100 * k + 102]
            frames, cache = encoder.forward_chunk(chunk, cache, prefix_extra_frames=prefix,
                                                  suffix_extra_frames=2)
            lengths.append(cache.length)
            if k == 3:
                fresh, _ = encoder.forward_chunk(chunk, None, prefix_extra_frames=2,
                                                 suffix_extra_frames=2)
                assert torch.equal(frames, fresh)
    assert lengths == [50, 100, 150, 50, 100, 150, 50, 100]


@pytest.mark.parametrize("shape,kwargs,match", [
    ((80, 4), {"prefix_extra_frames": 2, "suffix_extra_frames": 2}, "leaves no frame"),
    ((80, 3002), {}, "exceeds the table"),
    ((40, 104), {}, "mel bins"),
    ((80, 104), {"prefix_extra_frames": -1}, ">= 0"),
])
def test_forward_chunk_rejects_bad_chunks(
    pair: tuple[HFWhisperEncoder, WhisperEncoder], shape: tuple[int, int],
    kwargs: dict[str, int], match: str,
) -> None:
    with pytest.raises(ValueError, match=match):
        pair[1].forward_chunk(torch.zeros(shape), None, **kwargs)


def test_forward_rejects_clips_longer_than_the_table(
    pair: tuple[HFWhisperEncoder, WhisperEncoder],
) -> None:
    with pytest.raises(ValueError, match="max_source_positions"):
        pair[1](torch.zeros(1, 80, 3002))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible"):
        WhisperEncoderConfig(d_model=64, encoder_attention_heads=5)
    with pytest.raises(ValueError, match="encoder_layers"):
        WhisperEncoderConfig(encoder_layers=0)
    loaded = WhisperEncoderConfig.from_dict(
        {"d_model": 64, "encoder_layers": 2, "model_type": "whisper"})
    assert (loaded.d_model, loaded.encoder_layers, loaded.encoder_ffn_dim) == (64, 2, 4096)


def _linear_calls(encoder: WhisperEncoder, mel: torch.Tensor) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        encoder(mel)
    return sum(event.count for event in profile.key_averages() if event.key == "aten::linear")


def test_packed_projections_equal_transformers_and_take_weight_loads() -> None:
    """Packed before the load: the load writes through the parameters' views into the packed
    weight, and each layer's q, k, v is one GEMM (4 linears a layer, 6 unpacked)."""
    hf = _hf_encoder(TINY, seed=6)
    ours = WhisperEncoder(TINY).eval()
    ours.pack_projections()
    ours.load_state_dict(hf.state_dict(), strict=True)
    mel = _mel(3000, seed=7)  # transformers takes whole 30 s inputs only
    with torch.no_grad():
        torch.testing.assert_close(ours(mel), hf(mel).last_hidden_state, rtol=0,
                                   atol=PARITY_TOLERANCE)
        assert _linear_calls(ours, mel) == 4 * TINY.encoder_layers
        where = ours.layers[0].self_attn.q_proj.weight.data_ptr()
        ours.pack_projections()  # again: a no-op, graphs captured since may read the weights
        assert ours.layers[0].self_attn.q_proj.weight.data_ptr() == where
        ours.pack_projections(False)
        assert _linear_calls(ours, mel) == 6 * TINY.encoder_layers


def test_packed_projections_fall_back_when_a_move_breaks_the_views(
    pair: tuple[HFWhisperEncoder, WhisperEncoder],
) -> None:
    hf, _ = pair
    ours = _ours(hf, TINY)
    ours.pack_projections()
    ours.double()  # new tensors for every parameter: the packed weight is stale
    mel = _mel(400, seed=8).double()
    with torch.no_grad():
        expected = _ours(hf, TINY).double()(mel)
        torch.testing.assert_close(ours(mel), expected, rtol=0, atol=1e-12)
        assert _linear_calls(ours, mel) == 6 * TINY.encoder_layers


def test_packed_inside_inference_mode_serves_any_mode(
    pair: tuple[HFWhisperEncoder, WhisperEncoder],
) -> None:
    """The engine may pack under inference mode; a capture warms up with autograd on."""
    hf, plain = pair
    ours = _ours(hf, TINY)
    with torch.inference_mode():
        ours.pack_projections()
    mel = _mel(400, seed=9)
    with torch.no_grad():
        expected = plain(mel)
    torch.testing.assert_close(ours(mel).detach(), expected, rtol=0, atol=PARITY_TOLERANCE)
