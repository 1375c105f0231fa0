"""The linear-cost host draws equal whole-row draws with the runner's noise.

Reference: `device_sampler.sample_on_device` (temperature, top-k/top-p masks over the whole
row, argmax of logits + counter-based Gumbel noise of every token). `filtered_draw` must pick
the same token for the same step seed; `boundary_hit` must fire with probability
softmax(row)[token].
"""

from __future__ import annotations

import math

import pytest
import torch

from backends.runner.device_sampler import sample_on_device, uniform_at
from backends.runner.host_draws import (
    TopCandidates,
    _hinted_top_k,
    boundary_hit,
    filtered_draw,
    one_uniform_at,
    uniforms_at,
)
from backends.runner.sampler import apply_repetition_penalty

VOCAB = 5000


def _reference(row: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int) -> int:
    return int(sample_on_device(
        row[None], torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]),
        torch.tensor([seed]), use_filters=True,
    )[0])  # fmt: skip


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(0.7, 20, 0.8), (1.0, 20, 1.0), (0.3, 5, 0.5), (1.3, 1, 0.9)])
def test_filtered_draw_equals_the_whole_row_draw(temperature, top_k, top_p) -> None:
    gen = torch.Generator().manual_seed(0)
    for case in range(60):
        row = torch.randn(VOCAB, generator=gen) * 2.0
        row[torch.randint(0, VOCAB, (300,), generator=gen)] = float("-inf")  # masked ids
        seed = 1_000_003 * case + 17
        expected = _reference(row, temperature, top_k, top_p, seed)
        assert filtered_draw(row, temperature, top_k, top_p, seed) == expected, case


def test_ties_at_the_kth_value_stay_candidates() -> None:
    """bf16 logits tie often: every token tied with the k-th must remain drawable."""
    row = torch.full((VOCAB,), -5.0)
    row[100:130] = 1.0  # 30 tokens tied, top_k 20
    drawn = {filtered_draw(row, 1.0, 20, 1.0, seed) for seed in range(400)}
    assert drawn == set(range(100, 130))
    for seed in range(50):
        assert filtered_draw(row, 1.0, 20, 1.0, seed) == _reference(row, 1.0, 20, 1.0, seed)


def test_greedy_and_fully_masked_rows() -> None:
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    assert filtered_draw(row, 0.0, 20, 0.8, 3) == int(torch.argmax(row))
    assert filtered_draw(torch.full((VOCAB,), float("-inf")), 1.0, 20, 0.8, 3) == 0
    few = torch.full((VOCAB,), float("-inf"))
    few[[7, 9]] = torch.tensor([0.0, 0.1])
    assert {filtered_draw(few, 1.0, 20, 1.0, seed) for seed in range(100)} == {7, 9}


def test_boundary_hit_fires_with_the_softmax_probability() -> None:
    row = torch.full((VOCAB,), -1e4)
    row[10], row[11] = math.log(0.3), math.log(0.7)
    trials = 4000
    hits = sum(boundary_hit(row, 10, False, seed) for seed in range(trials))
    sigma = math.sqrt(0.3 * 0.7 / trials)
    assert abs(hits / trials - 0.3) < 5 * sigma, hits / trials
    assert boundary_hit(row, 11, True, 0) and not boundary_hit(row, 10, True, 0)
    row[10] = float("-inf")
    assert not any(boundary_hit(row, 10, False, seed) for seed in range(200))


def test_boundary_and_token_draws_use_different_noise() -> None:
    """Rule 4 and rule 5 draw in the same step: their uniforms must not be the same numbers."""
    row = torch.zeros(2)
    hits = [boundary_hit(row, 0, False, seed) for seed in range(2000)]
    draws = [filtered_draw(row, 1.0, 2, 1.0, seed) == 0 for seed in range(2000)]
    agree = sum(a == b for a, b in zip(hits, draws)) / 2000
    assert 0.45 < agree < 0.55, agree  # independent fair coins agree half the time


def test_host_uniforms_are_bitwise_the_device_sampler_noise() -> None:
    """The numpy noise of a few candidates equals `uniform_at`'s torch noise bit for bit, for
    seeds over the whole 63-bit range, the boundary key -1 and ids up to the Qwen3 vocabulary."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.cat([torch.tensor([-1, 0, 1, 151935]), torch.randint(0, 151936, (60,), generator=gen)])
    seeds = [0, 1, 2**62 + 12345, 2**63 - 1, *torch.randint(0, 2**62, (20,), generator=gen).tolist()]
    for seed in seeds:
        expected = uniform_at(torch.tensor(seed, dtype=torch.int64), ids)
        got = torch.from_numpy(uniforms_at(seed, ids.numpy()))
        assert torch.equal(got, expected), seed


def test_one_uniform_in_python_integers_is_bitwise_the_numpy_one() -> None:
    """The boundary draw's single uniform (`one_uniform_at`, Python integers) equals
    `uniforms_at`'s float32 for negative, small and 64-bit seeds and ids from -1 on."""
    gen = torch.Generator().manual_seed(6)
    seeds = [0, 1, -1, -(2**63), 2**63 - 1, *torch.randint(-(2**62), 2**62, (40,), generator=gen).tolist()]
    ids = [-1, 0, 1, 151935, *torch.randint(0, 151936, (20,), generator=gen).tolist()]
    for seed in seeds:
        expected = uniforms_at(seed, torch.tensor(ids).numpy())
        got = [one_uniform_at(seed, token) for token in ids]
        assert all(isinstance(u, float) for u in got)
        assert torch.equal(torch.tensor(got, dtype=torch.float64),
                           torch.from_numpy(expected).double()), seed


def _hint(row: torch.Tensor, n: int = 128) -> TopCandidates:
    values, ids = torch.topk(row, n)
    return TopCandidates(values.numpy(), ids.numpy(), row.shape[0])


def _mask_and_penalise(row: torch.Tensor, gen: torch.Generator, top_ids: torch.Tensor) -> None:
    """What a policy does to its row after the hint was taken: -inf on some ids (a few of the
    top ones among them) and the repetition penalty on others (top ones too)."""
    row[torch.randint(0, VOCAB, (200,), generator=gen)] = float("-inf")
    row[top_ids[torch.randint(0, 30, (4,), generator=gen)]] = float("-inf")
    history = torch.cat([torch.randint(0, VOCAB, (40,), generator=gen), top_ids[:6]]).tolist()
    apply_repetition_penalty(row, history, 1.3, 512)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 20, 0.8), (1.0, 5, 1.0)])
def test_a_hinted_draw_equals_the_unhinted_one(temperature, top_k, top_p) -> None:
    """The raw row's top candidates, taken before the masks and penalties, give the very draw
    the whole row gives; the hint is used in most cases, and left aside when it cannot be
    sure (here: most of its candidates masked)."""
    gen = torch.Generator().manual_seed(2)
    used = 0
    for case in range(80):
        raw = torch.randn(VOCAB, generator=gen) * 2.0
        raw[torch.randint(0, VOCAB, (40,), generator=gen)] = raw.max()  # ties at the top
        hint = _hint(raw)
        row = raw.clone()
        _mask_and_penalise(row, gen, torch.from_numpy(hint.ids))
        if case % 10 == 0:
            row[torch.from_numpy(hint.ids[:125])] = float("-inf")  # the hint cannot decide
        seed = 7919 * case + 3
        expected = filtered_draw(row, temperature, top_k, top_p, seed)
        assert filtered_draw(row, temperature, top_k, top_p, seed, hint) == expected, case
        used += _hinted_top_k(row, top_k, hint) is not None
        if case % 10 == 0:
            assert _hinted_top_k(row, top_k, hint) is None
    assert used >= 60, used


def test_a_hint_keeps_every_tie_with_the_kth_value() -> None:
    row = torch.full((VOCAB,), -5.0)
    row[100:130] = 1.0  # 30 tokens tied, top_k 20: all 30 are candidates
    hint = _hint(row)
    values, ids = _hinted_top_k(row, 20, hint)
    assert sorted(ids.tolist()) == list(range(100, 130)) and (values == 1.0).all()
    for seed in range(50):
        expected = filtered_draw(row, 1.0, 20, 1.0, seed)
        assert filtered_draw(row, 1.0, 20, 1.0, seed, hint) == expected
    # Top-p cuts through equal values: which of them stay depends on their order, which is by
    # id on both paths (the lowest 15 of the 30 ids).
    drawn = {filtered_draw(row, 1.0, 20, 0.5, seed, hint) for seed in range(300)}
    assert drawn == {filtered_draw(row, 1.0, 20, 0.5, seed) for seed in range(300)}
    assert drawn == set(range(100, 115))


def test_a_hint_below_a_limit_checks_the_ids_past_it() -> None:
    """Candidates taken among the first ids only (a tokenizer's vocabulary; the padding past
    it is what a policy masks): with the padding masked the hint serves the draw; an unmasked
    id past the limit that could compete sends the draw back to the row."""
    gen = torch.Generator().manual_seed(4)
    limit = VOCAB // 5
    for case in range(30):
        row = torch.randn(VOCAB, generator=gen) * 2.0
        values, ids = torch.topk(row[:limit], 64)
        hint = TopCandidates(values.numpy(), ids.numpy(), limit)
        row[limit:] = float("-inf")  # the policy's mask of the padding
        seed = 31 * case + 1
        assert _hinted_top_k(row, 20, hint) is not None
        expected = filtered_draw(row, 0.8, 20, 0.9, seed)
        assert filtered_draw(row, 0.8, 20, 0.9, seed, hint) == expected
        row[limit + case] = 100.0  # one padding id left unmasked, above every candidate
        assert _hinted_top_k(row, 20, hint) is None
        unmasked = filtered_draw(row, 0.8, 20, 0.9, seed)
        assert unmasked == limit + case and filtered_draw(row, 0.8, 20, 0.9, seed, hint) == unmasked
