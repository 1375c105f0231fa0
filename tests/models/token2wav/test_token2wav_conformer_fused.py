"""The encoder attention's fewer-kernel form (`conformer_fused`) against the reference form.

Strategy: one attention layer with left-padded caches of different lengths, right-padded
window frames and masked keys, in float32 (summation order only) and bfloat16, on CPU and at
the served shapes on CUDA; the whole encoder switched by `Token2Wav.set_fused_kernels`; the
packed projection's layout, its rebuild when a weight changes (in place, so captured graphs
read the new values) or is cast; the position shift over a strided batch layout.
"""

from __future__ import annotations

import pytest
import torch

from backends.models.token2wav import Token2WavConfig
from backends.models.token2wav.assets import random_token2wav
from backends.models.token2wav.conformer_fused import fused_attention, packed_projection
from backends.models.token2wav.encoder_packing import pack_encoder_inputs
from backends.models.token2wav.rel_position import shift_scores

ATOL = {torch.float32: 1e-5, torch.bfloat16: 0.05}  # bfloat16: a few roundings of values < 4


def _attention_inputs(attn, rows: int, frames: int, cached: int, device: str, dtype: torch.dtype,
                      seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    size = attn.num_heads * attn.head_dim
    x = torch.randn(rows, frames, size, generator=gen)
    cache = torch.randn(rows, attn.num_heads, cached, 2 * attn.head_dim, generator=gen)
    valid = torch.ones(rows, cached + frames, dtype=torch.bool)
    for r in range(rows):  # row r: r * 3 padded cache slots, r padded window frames
        valid[r, : min(cached, 3 * r)] = False
        valid[r, cached + frames - r :] = False
    table = torch.randn(cached + 2 * frames - 1, size, generator=gen)
    return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device)
                 for t in (x, cache, valid, table))


def _layer(dtype: torch.dtype, device: str = "cpu"):
    encoder = random_token2wav(Token2WavConfig.tiny(), seed=0).flow.encoder
    return encoder.to(device, dtype).encoders[0].self_attn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 11), (1, 12, 0), (2, 5, 40)])
def test_fused_attention_equals_reference(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    attn = _layer(dtype)
    rows, frames, cached = shape
    inputs = _attention_inputs(attn, rows, frames, cached, "cpu", dtype)
    with torch.inference_mode():
        attn.fused = False
        expected = attn(*inputs)
        attn.fused = True
        got = attn(*inputs)
    valid_frames = [frames - r for r in range(rows)]
    for r, n in enumerate(valid_frames):  # padded query frames are never read
        torch.testing.assert_close(got[0][r, :n].float(), expected[0][r, :n].float(),
                                   atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(got[1].float(), expected[1].float(), atol=ATOL[dtype], rtol=0)
    assert got[0].dtype == dtype and got[1].shape == expected[1].shape


def test_encoder_switch_covers_every_layer() -> None:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0)
    encoder = model.flow.encoder
    voice_cache = encoder.new_cache("cpu")
    codes = torch.randint(0, 6561, (2, 16), generator=torch.Generator().manual_seed(1))
    outputs = []
    for enabled in (False, True):
        model.set_fused_kernels(enabled)
        layers = [*encoder.encoders, *encoder.up_encoders]
        assert all(layer.self_attn.fused is enabled for layer in layers)
        with torch.inference_mode():
            inputs, _ = pack_encoder_inputs(encoder.config, model.flow.input_embedding(codes),
                                            [16, 9], [False, True], [voice_cache] * 2)
            outputs.append(encoder.run(inputs))
    for name in ("features", "token_kv", "mel_kv"):
        torch.testing.assert_close(getattr(outputs[1], name), getattr(outputs[0], name),
                                   atol=1e-5, rtol=0)


def test_packed_projection_layout_and_rebuilds() -> None:
    attn = _layer(torch.float32)
    heads, dk = attn.num_heads, attn.head_dim
    size = heads * dk
    weight, bias, masked = packed_projection(attn)
    assert masked.dim() == 0 and masked.item() == float("-inf")
    assert weight.shape == (4 * size, size) and packed_projection(attn)[0] is weight
    kv = weight[2 * size :].view(heads, 2, dk, size)
    assert torch.equal(kv[:, 0], attn.linear_k.weight.view(heads, dk, size))
    assert torch.equal(kv[:, 1], attn.linear_v.weight.view(heads, dk, size))
    expected_u = (attn.linear_q.bias + attn.pos_bias_u.flatten()) * dk ** -0.5
    torch.testing.assert_close(bias[:size], expected_u, atol=1e-7, rtol=0)
    with torch.no_grad():
        attn.pos_bias_v.add_(1.0)  # an in-place load: new values in the same tensors
    again = packed_projection(attn)
    assert again[1] is bias
    expected_v = (attn.linear_q.bias + attn.pos_bias_v.flatten()) * dk ** -0.5
    torch.testing.assert_close(bias[size : 2 * size], expected_v, atol=1e-7, rtol=0)
    attn.to(torch.bfloat16)
    assert packed_projection(attn)[0].dtype == torch.bfloat16


def test_shift_reads_a_strided_batch_layout() -> None:
    heads, batch, queries, keys = 3, 2, 4, 6
    products = torch.randn(heads, batch, queries, keys + queries - 1)
    strided = products.transpose(0, 1)  # [B, H, T, K + T - 1], rows whole
    assert not strided.is_contiguous()
    assert torch.equal(shift_scores(strided, keys), shift_scores(strided.contiguous(), keys))


def test_fused_attention_is_the_module_path() -> None:
    attn = _layer(torch.float32)
    inputs = _attention_inputs(attn, 2, 6, 9, "cpu", torch.float32)
    attn.fused = True
    with torch.inference_mode():
        direct, through = fused_attention(attn, *inputs), attn(*inputs)
    assert torch.equal(direct[0], through[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 50, 400), (3, 25, 200), (16, 50, 400)])
def test_served_shapes_on_cuda(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    """Full-size layer (512 wide, 8 heads), the mel- and token-rate windows with steady caches."""
    config = Token2WavConfig()
    attn = random_token2wav(config, seed=0).flow.encoder.encoders[0].self_attn.to("cuda", dtype)
    inputs = _attention_inputs(attn, *shape, "cuda", dtype)
    with torch.inference_mode():
        attn.fused = False
        expected = attn(*inputs)
        attn.fused = None  # CUDA: the fused form
        got = attn(*inputs)
    atol = 1e-4 if dtype == torch.float32 else ATOL[dtype]
    rows, frames, _ = shape
    for r in range(rows):
        torch.testing.assert_close(got[0][r, : frames - r].float(),
                                   expected[0][r, : frames - r].float(), atol=atol, rtol=0)
    torch.testing.assert_close(got[1].float(), expected[1].float(), atol=atol, rtol=0)
