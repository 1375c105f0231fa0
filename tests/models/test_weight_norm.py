"""Weight-norm folding against torch's own weight_norm parametrization.

Strategy: wrap real layers (Linear, Conv1d, ConvTranspose1d) with torch's `weight_norm(dim=0)`,
take the stored (g, v) under both key spellings, fold them, and compare with the weight torch
computes; then check the error paths name the broken layer.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from backends.models.weight_norm import (
    fold_weight_norm_keys,
    materialize_weight_norm,
    split_weight_norm,
)

# float32 recomputation of the same norm: only rounding differs
FOLD_ATOL = 1e-6


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(12, 7, bias=False), nn.Conv1d(5, 6, 3), nn.ConvTranspose1d(6, 4, 8, stride=4)]


@pytest.mark.parametrize("layer", _layers(), ids=lambda m: type(m).__name__)
def test_fold_equals_torch_weight_norm(layer: nn.Module) -> None:
    normed = weight_norm(layer, dim=0)
    with torch.no_grad():  # g != ||v|| so a fold that ignores g fails
        g = normed.parametrizations.weight.original0
        g.mul_(torch.rand_like(g) + 0.5)
    state = {f"head.{k}": v for k, v in normed.state_dict().items()}
    folded = fold_weight_norm_keys(state)
    assert "head.weight" in folded and not any("original" in k for k in folded)
    torch.testing.assert_close(folded["head.weight"], normed.weight.detach(), atol=FOLD_ATOL, rtol=0)


def test_legacy_spelling_folds_too() -> None:
    v = torch.randn(5, 3, 2)
    g = torch.rand(5, 1, 1) + 0.1
    state = {"conv.weight_g": g, "conv.weight_v": v, "conv.bias": torch.zeros(5)}
    folded = fold_weight_norm_keys(state)
    assert set(folded) == {"conv.weight", "conv.bias"}
    expected = g * v / v.norm(dim=(1, 2), keepdim=True)
    torch.testing.assert_close(folded["conv.weight"], expected, atol=FOLD_ATOL, rtol=0)


def test_split_then_fold_round_trips() -> None:
    weight = torch.randn(9, 4, 3)
    g, v = split_weight_norm(weight)
    torch.testing.assert_close(materialize_weight_norm(g, v), weight, atol=FOLD_ATOL, rtol=0)


@pytest.mark.parametrize("present", ["conv.weight_g", "conv.parametrizations.weight.original1"])
def test_half_a_pair_is_an_error_naming_the_layer(present: str) -> None:
    with pytest.raises(ValueError, match="'conv'"):
        fold_weight_norm_keys({present: torch.ones(2, 1)})


def test_mismatched_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="does not match"):
        materialize_weight_norm(torch.ones(3, 1), torch.ones(4, 2))
