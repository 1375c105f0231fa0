"""Device sampler: counter-based noise, batch independence, parity with the host sampler.

Strategy: the int64 torch hash is checked bit for bit against splitmix64 in Python integers
(wrapping arithmetic is what CPU and CUDA must agree on); a row's noise and token must not
depend on the other rows of the batch; the batched filters and draw must give the host
sampler's token for every row (same noise by construction); the draw must follow
softmax(logits / T) over many seeds (per-bin z-score).
"""

from __future__ import annotations

import math

import pytest
import torch

from backends.runner.device_sampler import (
    gumbel_noise,
    mask_top_k_top_p,
    sample_on_device,
    uniform_noise,
)
from backends.runner.sampler import (
    _splitmix64,
    apply_top_k,
    apply_top_p,
    sample_token,
    step_seed,
)
from backends.runner.types import SampleContext, SamplingParams

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
Z_BOUND = 5.0  # 5-sigma per bin


def test_uniform_bits_equal_python_splitmix64() -> None:
    seeds = [0, 1, step_seed(77, 5), (1 << 63) - 1]
    noise = uniform_noise(torch.tensor(seeds, dtype=torch.int64), 50)
    for row, seed in enumerate(seeds):
        for token in (0, 1, 49):
            bits = _splitmix64((seed + token * GOLDEN) & MASK64) >> 41
            assert noise[row, token].item() == (bits + 0.5) / 2**23


def test_noise_is_per_row_whatever_the_batch() -> None:
    seeds = torch.tensor([step_seed(s, p) for s, p in [(1, 0), (1, 1), (2, 0)]])
    together = gumbel_noise(seeds, 1000)
    for row in range(3):
        assert torch.equal(together[row], gumbel_noise(seeds[row : row + 1], 1000)[0])
    assert not torch.equal(together[0], together[1])


def host_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    ctx = SampleContext("r", position, [])
    return sample_token(logits, params, ctx, None)


def test_batched_draw_equals_host_sampler_row_by_row() -> None:
    gen = torch.Generator().manual_seed(0)
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0, seed=3),
        SamplingParams(temperature=0.7, top_k=5, seed=4),
        SamplingParams(temperature=1.3, top_p=0.6, seed=5),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=6),
    ]
    for trial in range(20):
        logits = torch.randn(len(params), 300, generator=gen) * 3
        positions = [trial * 7 + i for i in range(len(params))]
        tokens = sample_on_device(
            logits,
            torch.tensor([p.temperature for p in params]),
            torch.tensor([p.top_k for p in params]),
            torch.tensor([p.top_p for p in params]),
            torch.tensor([step_seed(p.seed, pos) for p, pos in zip(params, positions)]),
            use_filters=True,
        )
        expected = [host_token(logits[i], p, positions[i]) for i, p in enumerate(params)]
        assert tokens.tolist() == expected


def test_batched_filters_equal_host_filters() -> None:
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(1))
    top_k, top_p = torch.tensor([-1, 7, 50]), torch.tensor([0.5, 1.0, 0.8])
    masked = mask_top_k_top_p(logits, top_k, top_p)
    for row in range(3):
        expected = logits[row].clone()
        apply_top_k(expected, int(top_k[row]))
        apply_top_p(expected, float(top_p[row]))
        assert torch.equal(torch.isinf(masked[row]), torch.isinf(expected))


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_draw_follows_softmax(temperature: float) -> None:
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0])
    draws = 4000
    seeds = torch.tensor([step_seed(9, p) for p in range(draws)])
    tokens = sample_on_device(
        logits.expand(draws, 4),
        torch.full((draws,), temperature),
        torch.full((draws,), -1),
        torch.ones(draws),
        seeds,
        use_filters=False,
    )
    counts = torch.bincount(tokens, minlength=4).to(torch.float64)
    probs = torch.softmax(logits / temperature, dim=0).to(torch.float64)
    for token in range(4):
        expected = draws * probs[token].item()
        z = (counts[token].item() - expected) / math.sqrt(expected * (1 - probs[token].item()))
        assert abs(z) < Z_BOUND, f"token {token}: z = {z:.1f} ({counts.tolist()})"
