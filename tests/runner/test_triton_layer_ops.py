"""Fused layer kernels vs the reference modules' torch math (Triton's interpreter, float32).

Strategy: random inputs with non-unit norm weights; each kernel is compared with the
composition of the reference pieces it replaces (`RMSNorm`, `apply_rotary`, `write_kv`,
`F.silu`). The KV write is checked on the exact target rows, that padding rows (slot -1) write
nothing, and that every other cache row is untouched. Skipped where Triton is not installed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.decoder_backbone import RMSNorm  # noqa: E402
from backends.runner.rope import RotaryEmbedding, apply_rotary  # noqa: E402
from backends.runner.triton_layer_ops import (  # noqa: E402
    qk_norm_rope_store_kv,
    rms_norm,
    silu_and_mul,
)

ATOL = 2e-5  # float32 either way; only reduction order and cos/sin implementations differ
EPS = 1e-6
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def reference_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    norm = RMSNorm(x.shape[-1], EPS)
    norm.weight.data = weight
    return norm(x)


@pytest.mark.interpreter
def test_rms_norm_without_and_with_residual() -> None:
    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(5, 48, generator=gen), torch.randn(5, 48, generator=gen)
    weight = torch.rand(48, generator=gen) + 0.5
    out, same = rms_norm(x, weight, EPS)
    torch.testing.assert_close(out, reference_norm(x, weight), atol=ATOL, rtol=0)
    assert same is x
    out, summed = rms_norm(x, weight, EPS, residual=residual)
    torch.testing.assert_close(summed, x + residual, atol=ATOL, rtol=0)
    torch.testing.assert_close(out, reference_norm(x + residual, weight), atol=ATOL, rtol=0)


@pytest.mark.parametrize("has_qk_norm", [True, False])
@pytest.mark.interpreter
def test_qk_norm_rope_store_kv(has_qk_norm: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, tokens, blocks, page = 4, 2, 16, 3, 5, 4
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    positions = torch.tensor([0, 7, 1234])
    slots = torch.tensor([3, -1, 17])  # the middle row is padding
    rotary = RotaryEmbedding(dim, 10_000.0)
    q_w, k_w = torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5
    k_cache = torch.randn(blocks, page, kv_heads, dim, generator=gen)
    v_cache = torch.randn(blocks, page, kv_heads, dim, generator=gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    qk_norm = (q_w, k_w, EPS) if has_qk_norm else None
    query = qk_norm_rope_store_kv(
        qkv, positions, slots, rotary.inv_freq, qk_norm, k_cache, v_cache, heads
    )
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    q, k = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)
    if has_qk_norm:
        q, k = reference_norm(q, q_w), reference_norm(k, k_w)
    cos, sin = rotary.cos_sin(positions, torch.float32)
    torch.testing.assert_close(query, apply_rotary(q, cos, sin), atol=ATOL, rtol=0)
    expected_k = apply_rotary(k, cos, sin)
    flat_k, flat_v = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
    for row, slot in ((0, 3), (2, 17)):
        torch.testing.assert_close(flat_k[slot], expected_k[row], atol=ATOL, rtol=0)
        assert torch.equal(flat_v[slot], v[row].view(kv_heads, dim))
    untouched = [r for r in range(blocks * page) if r not in (3, 17)]
    assert torch.equal(flat_k[untouched], before_k.view(-1, kv_heads, dim)[untouched])
    assert torch.equal(flat_v[untouched], before_v.view(-1, kv_heads, dim)[untouched])


@pytest.mark.interpreter
def test_silu_and_mul() -> None:
    gate_up = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(2))
    gate, up = gate_up.chunk(2, dim=1)  # 1500 columns: two column blocks, the last partial
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, atol=ATOL, rtol=0)
