"""Per-slot sampling tables (`SamplingStates`) against the host sampler, on CPU.

Strategy: the device step seed must be bitwise the host's `step_seed` (seeds across the whole
64-bit range, negative and oversized Python ints included); a batched draw that gathers each
row's params by slot must give, row for row, the token the host sampler draws for that
request at that position, for every kind of params (greedy, temperature only, top-k, top-p,
both), with slots out of order, a slot re-assigned to new params, and scratch rows.
"""

from __future__ import annotations

import random

import pytest
import torch

from backends.runner.device_sampler import as_int64, step_seeds
from backends.runner.sampler import sample_token, step_seed
from backends.runner.sampling_states import SamplingStates
from backends.runner.types import SampleContext, SamplingParams

VOCAB = 500


def test_device_step_seeds_are_the_host_step_seeds() -> None:
    rng = random.Random(3)
    seeds = [0, 1, 42, -5, (1 << 63), (1 << 64) - 1, (1 << 70) + 3]
    seeds += [rng.getrandbits(64) for _ in range(100)]
    positions = [rng.randrange(0, 1 << 40) for _ in seeds]
    got = step_seeds(torch.tensor([as_int64(s) for s in seeds]), torch.tensor(positions))
    assert got.tolist() == [step_seed(s, p) for s, p in zip(seeds, positions)]


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=1.3, top_k=5, seed=-2),
    SamplingParams(temperature=0.9, top_p=0.6, seed=1 << 63),
    SamplingParams(temperature=0.8, top_k=25, top_p=0.85, seed=42),
    SamplingParams(temperature=0.0, top_k=3, seed=9),  # greedy: filters never matter
]


def host_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    ctx = SampleContext("r", position, [])
    return sample_token(logits, params, ctx, None)


def test_batched_draw_by_slot_equals_the_host_sampler() -> None:
    states = SamplingStates(8, "cpu")
    slots = [6, 2, 7, 0, 3, 5]  # PARAMS[i] lives in slots[i]
    for slot, params in zip(slots, PARAMS):
        states.set(slot, params)
    gen = torch.Generator().manual_seed(0)
    for step in range(40):
        logits = torch.randn(len(PARAMS) + 1, VOCAB, generator=gen) * 3
        positions = [step * 3 + i for i in range(len(PARAMS))]
        rows = torch.tensor(slots + [states.scratch_slot])
        got = states.sample(logits.clone(), rows, torch.tensor(positions + [0])).tolist()
        expected = [host_token(logits[i], p, positions[i]) for i, p in enumerate(PARAMS)]
        assert got[:-1] == expected, step
        assert got[-1] == int(torch.argmax(logits[-1]))  # the scratch row is greedy


def test_a_reassigned_slot_draws_with_its_new_params() -> None:
    states = SamplingStates(2, "cpu")
    states.set(1, PARAMS[4])
    states.set(1, PARAMS[2])
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    got = states.sample(logits.clone(), torch.tensor([1]), torch.tensor([17]))
    assert got.tolist() == [host_token(logits[0], PARAMS[2], 17)]


def test_set_writes_reach_the_device_in_one_copy_per_table_at_flush(monkeypatch) -> None:
    from backends.runner import sampling_states

    copies = []
    monkeypatch.setattr(sampling_states, "copy_to_device",
                        lambda dst, array: copies.append(array.copy()) or dst.copy_(
                            torch.from_numpy(array)))  # fmt: skip
    states = SamplingStates(4, "cpu")
    for slot in (0, 2, 3):
        states.set(slot, PARAMS[slot])
    assert copies == []
    states.flush()
    assert len(copies) == 2 and copies[0][2].tolist() == pytest.approx(
        [PARAMS[2].temperature, PARAMS[2].top_p])
    states.flush()
    assert len(copies) == 2  # nothing new to publish
