"""Audio projector and pool: names, shapes and the arithmetic, against hand-written formulas.

Strategy: the projector must equal linear2(relu(linear1(x))) with its own weights and carry
the checkpoint names; the pool must equal the mean of consecutive groups of 5 frames, drop an
incomplete group, and give 10 rows for the 50 encoder frames of one unit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from backends.models.audio_projector import AUDIO_POOL_STEP, AudioAvgPool, MultiModalProjector


def test_projector_names_and_math() -> None:
    torch.manual_seed(0)
    projector = MultiModalProjector(64, 48)
    assert list(projector.state_dict()) == ["linear1.weight", "linear1.bias",
                                            "linear2.weight", "linear2.bias"]
    frames = torch.randn(50, 64)
    hidden = torch.clamp(frames @ projector.linear1.weight.T + projector.linear1.bias, min=0)
    expected = hidden @ projector.linear2.weight.T + projector.linear2.bias
    torch.testing.assert_close(projector(frames), expected)
    assert projector(torch.randn(2, 50, 64)).shape == (2, 50, 48)


def test_pool_averages_groups_of_five() -> None:
    frames = torch.arange(52 * 3, dtype=torch.float32).reshape(52, 3)  # 2 frames left over
    pooled = AudioAvgPool()(frames)
    assert AUDIO_POOL_STEP == 5 and pooled.shape == (10, 3)
    torch.testing.assert_close(pooled, frames[:50].reshape(10, 5, 3).mean(dim=1))


def test_pool_keeps_a_batch_axis() -> None:
    assert AudioAvgPool()(torch.randn(2, 50, 8)).shape == (2, 10, 8)


@pytest.mark.parametrize("build", [lambda: AudioAvgPool(0), lambda: MultiModalProjector(0, 4)])
def test_rejects_non_positive_sizes(build: Callable[[], nn.Module]) -> None:
    with pytest.raises(ValueError):
        build()


def test_pool_rejects_flat_input() -> None:
    with pytest.raises(ValueError):
        AudioAvgPool()(torch.zeros(10))
