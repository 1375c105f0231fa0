"""The DiT's fused Triton kernels (`dit_norm_kernels`, `dit_attention_kernel`, `dit_fused`)
against the torch ops they replace, in Triton's interpreter on CPU (tests/conftest.py sets
TRITON_INTERPRET before triton is imported).

Strategy: each kernel on small odd shapes (rows of different window and cache lengths, masked
keys, caches longer than one key block, windows longer than one query block) in float32 and
bfloat16 against the torch composition; then the whole fused DiT against the torch DiT
(the reference path), caches included. float32 differs by summation order only; bfloat16 by
the roundings the fused kernels skip (one per output instead of one per op).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.token2wav import Token2WavConfig, dit_gemm  # noqa: E402
from backends.models.token2wav.assets import random_token2wav  # noqa: E402
from backends.models.token2wav.dit import _last_two, gather_cache  # noqa: E402
from backends.models.token2wav.dit_attention_kernel import key_splits, masked_attention  # noqa: E402
from backends.models.token2wav.dit_fused import packed_qkv  # noqa: E402
from backends.models.token2wav.dit_norm_kernels import (  # noqa: E402
    norm_mish_taps,
    residual_norm,
    residual_norm_taps,
)

# float32: reduction order only (measured <= 7e-7). bfloat16: up to two ulps of values < 4.
ATOL = {torch.float32: 1e-5, torch.bfloat16: 0.0625}
DTYPES = (torch.float32, torch.bfloat16)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _randn(generator: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(dtype)


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.float(), expected.float(), atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.interpreter
def test_residual_norm(dtype: torch.dtype, per_row: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    rows, frames, width = 3, 5, 48
    x, y = (_randn(gen, rows * frames, width, dtype=dtype) for _ in range(2))
    mods = _randn(gen, rows if per_row else 1, 9, width, dtype=dtype)  # strided rows, like DiT's
    gate, shift, scale = mods[:, 2], mods[:, 0], mods[:, 1]
    x_out, h = residual_norm(x, (y, gate), shift, scale, frames, 1e-6)
    stream = torch.addcmul(x.view(rows, frames, width), gate[:, None], y.view(rows, frames, width))
    expected = torch.addcmul(shift[:, None], F.layer_norm(stream, (width,), eps=1e-6), scale[:, None])
    _close(x_out.view(rows, frames, width), stream, dtype)
    _close(h.view(rows, frames, width), expected, dtype)
    same, h = residual_norm(x, None, shift, scale, frames, 1e-6)
    assert same is x
    plain = F.layer_norm(x.view(rows, frames, width), (width,), eps=1e-6)
    _close(h.view(rows, frames, width), torch.addcmul(shift[:, None], plain, scale[:, None]), dtype)


def _reference_taps(cache: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cache [R, C, 2], h [R, T, C] -> (taps [R, T, C, 3], padded input [R, C, 2 + T])."""
    padded = torch.cat([cache, h.transpose(1, 2)], dim=2)
    frames = h.shape[1]
    taps = torch.stack([padded[:, :, k : k + frames] for k in range(3)], dim=-1)
    return taps.transpose(1, 2), padded


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.interpreter
def test_conv_taps_and_next_caches(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    rows, frames, width = 3, 6, 32
    num_new = torch.tensor([6, 1, 3])  # a full window, one frame (reads into the cache), three
    cache = _randn(gen, rows, 2 * width, 2, dtype=dtype)
    tail = torch.full((rows, 2 * width, 2), float("nan"), dtype=dtype)
    x, y = (_randn(gen, rows * frames, width, dtype=dtype) for _ in range(2))
    mods = _randn(gen, 1, 9, width, dtype=dtype)
    state = (cache, tail, num_new)
    x_out, taps = residual_norm_taps(x, (y, mods[:, 8]), mods[:, 6], mods[:, 7], 1e-6, state)
    _, h = residual_norm(x, (y, mods[:, 8]), mods[:, 6], mods[:, 7], frames, 1e-6)
    expected, padded = _reference_taps(cache[:, :width], h.view(rows, frames, width))
    _close(taps.view(rows, frames, width, 3), expected, dtype)
    _close(tail[:, :width], _last_two(padded, num_new), dtype)
    norm = torch.nn.LayerNorm(width).to(dtype)
    torch.nn.init.normal_(norm.weight, generator=gen)
    torch.nn.init.normal_(norm.bias, generator=gen)
    with torch.no_grad():
        taps = norm_mish_taps(x, norm, state)
        mish = F.mish(norm(x)).view(rows, frames, width)
    expected, padded = _reference_taps(cache[:, width:], mish)
    _close(taps.view(rows, frames, width, 3), expected, dtype)
    _close(tail[:, width:], _last_two(padded, num_new), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("cached", "splits"), [(0, None), (70, None), (70, 1), (70, 2), (70, 3), (70, 5)])
@pytest.mark.interpreter
def test_masked_attention(dtype: torch.dtype, cached: int, splits: int | None) -> None:
    """Window tile + 2 cache tiles: split 1 (one pass), 2 (window + a cache tile | the other), 3
    (a tile each), 5 (two splits without keys)."""
    gen = torch.Generator().manual_seed(2)
    rows, heads, dim, frames = 2, 2, 16, 21  # 21 frames: two query blocks
    qkv = _randn(gen, rows * frames, 3 * heads * dim, dtype=dtype)
    norms = [torch.nn.LayerNorm(dim, eps=1e-5).to(dtype) for _ in range(2)]
    for norm in norms:
        torch.nn.init.normal_(norm.weight, generator=gen)
        torch.nn.init.normal_(norm.bias, generator=gen)
    cache = _randn(gen, rows, heads, cached, 2 * dim, dtype=dtype)
    valid = torch.rand(rows, frames + cached, generator=gen) > 0.3
    valid[1, 13:frames] = False  # row 1: a 13-frame window padded to 21
    valid[:, 0] = True
    new_kv = torch.empty(rows, heads, frames, 2 * dim, dtype=dtype)
    out = masked_attention(qkv, norms[0], norms[1], cache, valid, new_kv, splits=splits)
    with torch.no_grad():
        q, k, v = (part.transpose(1, 2) for part in qkv.view(rows, frames, 3, heads, dim).unbind(2))
        expected_kv = torch.cat([norms[1](k), v], dim=-1)
        keys, values = torch.cat([expected_kv, cache], dim=2).chunk(2, dim=-1)
        expected = F.scaled_dot_product_attention(norms[0](q), keys, values,
                                                  attn_mask=valid[:, None, None, :])
    _close(new_kv, expected_kv, dtype)
    _close(out.view(rows, frames, heads, dim), expected.transpose(1, 2), dtype)


def test_key_splits_fill_the_gpu_only_while_programs_are_few() -> None:
    assert key_splits(64, 8) == 4  # a window of one stream: 4 splits of 2 tiles
    assert key_splits(64, 7) == 4 and key_splits(64, 3) == 3 and key_splits(64, 1) == 1
    assert key_splits(128, 8) == 3 and key_splits(264, 8) == 1 and key_splits(1024, 8) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_keys_equal_one_pass_at_the_served_shape_on_cuda() -> None:
    """One stream's window in bfloat16 (2 CFG rows, 8 heads of 64, 56 frames, 300 cached
    frames read through the pool): the split path against one pass and against SDPA."""
    gen = torch.Generator().manual_seed(3)
    rows, heads, dim, frames, cached = 2, 8, 64, 56, 300
    dtype, device = torch.bfloat16, "cuda"
    qkv = _randn(gen, rows * frames, 3 * heads * dim, dtype=dtype).to(device)
    norms = [torch.nn.LayerNorm(dim, eps=1e-6).to(device, dtype) for _ in range(2)]
    pool = _randn(gen, 4, heads, cached + 1, 2 * dim, dtype=dtype).to(device)
    pool_rows = torch.tensor([2, 1], device=device)
    order = torch.stack([torch.randperm(cached, generator=gen) for _ in range(rows)]).to(device)
    valid = (torch.rand(rows, frames + cached, generator=gen) > 0.2).to(device)
    outputs, kvs = [], []
    for splits in (None, 1):
        kvs.append(torch.empty(rows, heads, frames, 2 * dim, dtype=dtype, device=device))
        outputs.append(masked_attention(qkv, norms[0], norms[1], pool, valid, kvs[-1], (pool_rows, order),
                                        splits=splits))
    assert key_splits(-(-frames // 16) * rows * heads, 1 + -(-cached // 64)) > 1  # the split path ran
    assert torch.equal(kvs[0], kvs[1])
    torch.testing.assert_close(outputs[0].float(), outputs[1].float(), atol=2e-2, rtol=0)
    with torch.no_grad():
        q = qkv.view(rows, frames, 3, heads, dim)[:, :, 0].transpose(1, 2)
        keys, values = torch.cat([kvs[1], gather_cache(pool, pool_rows, order)], 2).chunk(2, -1)
        expected = F.scaled_dot_product_attention(norms[0](q), keys, values, attn_mask=valid[:, None, None, :])
    torch.testing.assert_close(outputs[0].view(rows, frames, heads, dim).float(),
                               expected.transpose(1, 2).float(), atol=3e-2, rtol=0)


def _dit_inputs(dit, gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    c = dit.config
    rows, frames, cached = 3, 21, 37
    valid = torch.rand(rows, frames + cached, generator=gen) > 0.3
    valid[:, 0] = True
    return (_randn(gen, rows, 320, frames, dtype=dtype), torch.rand(rows, generator=gen),
            _randn(gen, c.depth, rows, 2 * c.hidden_size, 2, dtype=dtype),
            _randn(gen, c.depth, rows, c.num_heads, cached, 2 * c.head_dim, dtype=dtype),
            valid, torch.tensor([21, 5, 2]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [True, False])
@pytest.mark.interpreter
def test_fused_dit_equals_torch_dit(dtype: torch.dtype, split_k: bool, monkeypatch) -> None:
    """Also with the convs' and fc2's K unsplit, as batches past the split rows run them
    (these 3 x 21 rows split it)."""
    if not split_k:
        monkeypatch.setattr(dit_gemm, "_SPLIT_ROWS", ())
    dit = random_token2wav(Token2WavConfig.tiny(), seed=0).flow.decoder.estimator.to(dtype)
    inputs = _dit_inputs(dit, torch.Generator().manual_seed(3), dtype)
    with torch.inference_mode():
        dit.fused = False
        expected = dit.forward_chunk(*inputs)
        dit.fused = True
        assert dit.uses_fused_kernels(inputs[0])
        got = dit.forward_chunk(*inputs)
    for a, b in zip(got, expected):
        assert a.shape == b.shape and a.dtype == b.dtype
        _close(a, b, dtype)


def test_fused_path_switch_and_packed_weights() -> None:
    dit = random_token2wav(Token2WavConfig.tiny(), seed=0).flow.decoder.estimator
    one_frame = torch.zeros(1, 320, 1)
    assert not dit.uses_fused_kernels(torch.zeros(1, 320, 4))  # None: CUDA only
    dit.fused = True
    assert not dit.uses_fused_kernels(one_frame)  # conv taps need two frames
    attn = dit.blocks[0].attn
    weight, bias = packed_qkv(attn)
    assert torch.equal(weight, torch.cat([attn.to_q.weight, attn.to_k.weight, attn.to_v.weight]))
    assert packed_qkv(attn)[0] is weight  # built once
    with torch.no_grad():
        attn.to_k.bias.add_(1.0)  # an in-place load: rebuilt
    assert torch.equal(packed_qkv(attn)[1][bias.shape[0] // 3 : 2 * bias.shape[0] // 3],
                       attn.to_k.bias)
    dit.to(torch.bfloat16)
    assert packed_qkv(attn)[0].dtype == torch.bfloat16
