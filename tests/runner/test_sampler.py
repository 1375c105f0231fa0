"""Sampler: greedy, seeded reproducibility, filters, distribution, penalty, hooks.

Strategy: literal cases for the deterministic parts; for the random part, many draws over
distinct (seed, position) pairs compared with softmax(logits / T) by a per-bin z-score bound,
so a wrong temperature or a biased noise fails with the measured value in the message.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from backends.runner.sampler import (
    apply_repetition_penalty,
    apply_top_k,
    apply_top_p,
    sample_token,
    step_seed,
)
from backends.runner.host_draws import TopCandidates
from backends.runner.types import SampleContext, SamplingParams

NUM_DRAWS = 4000
Z_BOUND = 5.0  # 5-sigma per bin: a false alarm is ~1e-6 per bin, a temperature bug is >> 5


def ctx_at(position: int, seed: int = 0, generated: list[int] | None = None) -> SampleContext:
    return SampleContext("r", position, generated or [])


def draw(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    return sample_token(logits, params, ctx_at(position, params.seed), None)


def test_greedy_is_argmax_whatever_the_filters() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    params = SamplingParams(temperature=0.0, top_k=1, top_p=0.1, seed=5)
    assert {draw(logits, params, p) for p in range(20)} == {1}


def test_same_seed_and_position_same_token_and_logits_untouched() -> None:
    logits = torch.randn(300, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    params = SamplingParams(temperature=1.0, seed=11)
    tokens = [draw(logits, params, p) for p in range(40)]
    assert tokens == [draw(logits, params, p) for p in range(40)]
    assert len(set(tokens)) > 10, "positions do not vary the noise"
    assert torch.equal(logits, before)
    assert step_seed(11, 0) != step_seed(11, 1) != step_seed(12, 0)


def test_temperature_distribution_matches_softmax() -> None:
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0])
    temperature = 0.7
    params = SamplingParams(temperature=temperature, seed=3)
    counts = torch.zeros(4)
    for position in range(NUM_DRAWS):
        counts[draw(logits, params, position)] += 1
    probs = torch.softmax(logits / temperature, dim=0)
    for token in range(4):
        expected = NUM_DRAWS * probs[token].item()
        z = (counts[token].item() - expected) / math.sqrt(expected * (1 - probs[token].item()))
        assert abs(z) < Z_BOUND, f"token {token}: z = {z:.1f} ({counts.tolist()})"


def test_top_k_and_top_p_restrict_support() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    top_k = {draw(logits, SamplingParams(temperature=5.0, top_k=2), p) for p in range(300)}
    assert top_k == {0, 1}
    # probs at T=1: [.41, .25, .15, .09, .06, .03]; mass before token 2 is .665 < .7, token 3 .817
    top_p = {draw(logits, SamplingParams(temperature=1.0, top_p=0.7), p) for p in range(300)}
    assert top_p == {0, 1, 2}


def test_filter_literals() -> None:
    row = torch.tensor([1.0, 3.0, 3.0, 0.0])
    apply_top_k(row, 2)
    assert row.tolist() == [float("-inf"), 3.0, 3.0, float("-inf")]
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    apply_top_p(row, 0.5)  # the first token alone already holds 0.5
    assert torch.isinf(row[1:]).all() and not torch.isinf(row[0])


def test_repetition_penalty_hf_style_over_window() -> None:
    row = torch.tensor([2.0, -2.0, 2.0, 1.0])
    apply_repetition_penalty(row, generated=[2, 0, 1, 1], penalty=2.0, window=3)
    assert row.tolist() == [1.0, -4.0, 2.0, 1.0]  # token 2 is outside the window of 3


class RewriteHook:
    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        logits[0] = float("-inf")
        return 42 if ctx.position == 7 else None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token + 100


def test_hook_masks_forces_and_rewrites() -> None:
    logits = torch.tensor([9.0, 1.0, 0.0])
    greedy = SamplingParams()
    assert sample_token(logits, greedy, ctx_at(3), RewriteHook()) == 101
    assert sample_token(logits, greedy, ctx_at(7), RewriteHook()) == 142


def test_owned_row_is_worked_on_in_place_with_the_same_draws() -> None:
    """`owned`: the caller gives the row away (the fast path's host copy), so the penalty and
    the hook's masks land in it instead of a copy; every draw stays what the copy gave. A row
    of another dtype is still copied (to float32), so it is never written."""
    params = SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=3)
    base = torch.randn(300, generator=torch.Generator().manual_seed(1))
    history = [5, 7, 7, 250]
    for position in range(30):
        shared = base.clone()
        copied = sample_token(shared, params, ctx_at(position, 3, history), RewriteHook())
        assert torch.equal(shared, base)
        owned = base.clone()
        assert sample_token(owned, params, ctx_at(position, 3, history), RewriteHook(),
                            owned=True) == copied
        penalised = base[7] / 1.3 if base[7] > 0 else base[7] * 1.3
        assert owned[0] == float("-inf") and owned[7] == penalised  # worked on in place
    half = base.to(torch.bfloat16)
    before = half.clone()
    sample_token(half, params, ctx_at(0, 3, history), RewriteHook(), owned=True)
    assert torch.equal(half, before)


def test_repetition_penalty_on_a_host_row_matches_the_device_formula() -> None:
    """The host row's numpy path is the torch formula bit for bit (float32 both ways)."""
    row = torch.randn(5000, generator=torch.Generator().manual_seed(2)) * 8
    generated = list(range(0, 5000, 3)) + [4999, 4999, 7000]  # an id past the row is skipped
    expected = row.clone()
    ids = torch.tensor(sorted(set(generated)))
    ids = ids[ids < row.shape[0]]
    picked = expected[ids]
    expected[ids] = torch.where(picked > 0, picked / 1.17, picked * 1.17)
    apply_repetition_penalty(row, generated, penalty=1.17, window=0)
    assert torch.equal(row, expected)


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_k": 0}, {"top_p": 0.0}, {"repetition_penalty": 0.0}],
)
def test_invalid_params_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_top_candidates_are_ignored_where_a_logit_may_have_risen() -> None:
    """The runner's raw top candidates are used by the runner's own draw only when nothing
    could raise a logit: with a repetition penalty below 1 (a repeated negative logit rises)
    or a hook that returned no token, the draw scans the row."""
    logits = torch.full((200,), -3.0)
    logits[:30] = torch.linspace(2.0, 1.0, 30)
    logits[150] = 0.5  # outside the 25 candidates
    values, ids = torch.topk(logits, 25)
    hint = TopCandidates(values.numpy(), ids.numpy(), 200)
    encourage = SamplingParams(temperature=1.0, top_k=1, repetition_penalty=0.01, seed=5)
    ctx = dataclasses.replace(ctx_at(4, 5), generated=[150], candidates=hint)
    assert sample_token(logits, encourage, ctx, None) == 150  # 0.5 / 0.01: now the largest
    plain = SamplingParams(temperature=1.0, top_k=1, seed=5)
    assert sample_token(logits, plain, ctx, None) == 0  # the hint serves a plain draw

    class Raise:
        def before_sample(self, row: torch.Tensor, ctx: SampleContext) -> None:
            row[199] = 50.0  # far above every candidate

        def after_sample(self, token: int, ctx: SampleContext) -> int:
            return token

    assert sample_token(logits, plain, ctx, Raise()) == 199
