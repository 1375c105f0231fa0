"""Shared decoder pieces: RMSNorm equals HF's, and the spec rejects impossible geometry."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from backends.models.decoder_backbone import BackboneSpec, RMSNorm, require_positive

SPEC = dict(
    vocab_size=10,
    hidden_size=8,
    intermediate_size=16,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    has_qk_norm=True,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_hf(dtype: torch.dtype) -> None:
    """HF normalises in float32 and casts back before the weight; bf16 shows any difference."""
    x = (torch.randn(5, 8, generator=torch.Generator().manual_seed(0)) * 30).to(dtype)
    weight = torch.rand(8) + 0.5
    ours, hf = RMSNorm(8, 1e-6).to(dtype), Qwen3RMSNorm(8, 1e-6).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(weight)
        hf.weight.copy_(weight)
        assert torch.equal(ours(x), hf(x))


@pytest.mark.parametrize(
    "overrides,message",
    [({"num_kv_heads": 3}, "multiple"), ({"head_dim": 5}, "even")],
)
def test_spec_rejects_bad_heads(overrides: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BackboneSpec(**{**SPEC, **overrides})  # type: ignore[arg-type]


def test_require_positive_names_the_field() -> None:
    require_positive("Cfg", {"a": 1, "b": 0.5})
    with pytest.raises(ValueError, match=r"Cfg.b must be a positive number, got 0"):
        require_positive("Cfg", {"a": 1, "b": 0})
    with pytest.raises(ValueError, match="Cfg.flag"):
        require_positive("Cfg", {"flag": True})
