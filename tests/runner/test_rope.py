"""RoPE: agreement with transformers' Qwen3 rotary embedding, and exact re-rotation.

Strategy: HF's own `Qwen3RotaryEmbedding` + `apply_rotary_pos_emb` are the reference for the
forward rotation; re-rotation is checked by its defining identity R(p + d) = R(d) R(p) at
positions large enough that a wrong pairing (interleaved vs rotate-half) or sign shows up.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.qwen3 import modeling_qwen3

from backends.runner.rope import RotaryEmbedding, apply_rotary

HEAD_DIM, THETA = 16, 10_000.0
# float32 trig at positions up to ~5000: HF and we both round the angle once.
ATOL = 1e-5
# Two paths to the same angle near 4000 rad round differently in float32 (ulp ~2.4e-4 rad).
REROTATE_ATOL = 1e-4


def random_heads(num_tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_tokens, 2, HEAD_DIM, generator=torch.Generator().manual_seed(seed))


def test_matches_hf_rotary() -> None:
    config = transformers.Qwen3Config(
        hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM, rope_theta=THETA
    )
    hf_rotary = modeling_qwen3.Qwen3RotaryEmbedding(config)
    positions = torch.tensor([0, 1, 17, 1000, 4095])
    x = random_heads(5)
    hf_cos, hf_sin = hf_rotary(x, positions[None, :])
    expected, _ = modeling_qwen3.apply_rotary_pos_emb(
        x.transpose(0, 1)[None], x.transpose(0, 1)[None], hf_cos, hf_sin
    )
    cos, sin = RotaryEmbedding(HEAD_DIM, THETA).cos_sin(positions, torch.float32)
    got = apply_rotary(x, cos, sin)
    torch.testing.assert_close(got, expected[0].transpose(0, 1), atol=ATOL, rtol=0)


@pytest.mark.parametrize("delta", [-3000, -16, -1, 5])
def test_rerotate_composes_positions(delta: int) -> None:
    rope = RotaryEmbedding(HEAD_DIM, THETA)
    positions = torch.tensor([3000, 3017, 4000])
    x = random_heads(3, seed=1)
    cos, sin = rope.cos_sin(positions, torch.float32)
    moved_cos, moved_sin = rope.cos_sin(positions + delta, torch.float32)
    got = rope.rerotate_keys(apply_rotary(x, cos, sin), delta)
    expected = apply_rotary(x, moved_cos, moved_sin)
    torch.testing.assert_close(got, expected, atol=REROTATE_ATOL, rtol=0)


def test_rerotate_zero_is_identity_and_keeps_dtype() -> None:
    rope = RotaryEmbedding(HEAD_DIM, THETA)
    keys = random_heads(4).to(torch.bfloat16)
    out = rope.rerotate_keys(keys, 0)
    assert out.dtype == torch.bfloat16 and torch.equal(out, keys)


def test_bf16_tables_use_float32_angles() -> None:
    """A bf16 position product would put the angle at 4095 off by several radians."""
    rope = RotaryEmbedding(HEAD_DIM, THETA)
    cos16, _ = rope.cos_sin(torch.tensor([4095]), torch.bfloat16)
    cos32, _ = rope.cos_sin(torch.tensor([4095]), torch.float32)
    torch.testing.assert_close(cos16.float(), cos32, atol=1e-2, rtol=0)


def test_rejects_odd_head_dim() -> None:
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(15, THETA)
