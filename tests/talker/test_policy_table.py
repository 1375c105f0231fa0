"""The device chunk policy (`TalkerPolicyTable`) against the host policy (`TalkerChunkPolicy`).

Strategy: simulated Talker requests run the same chunk plans on both paths, with the same
scripted logits per (request, chunk step): the host path is the runner's own host sampler
(`sample_token` with the policy as hook, one row at a time); the device path is the table as
the `DeviceLogitsProcessor` of the runner's `SamplingStates`, one batched draw per step (here
on CPU tensors), with rows shuffled, slots out of order and scratch padding rows mixed in.
Everything must be identical: the processed logits bit for bit (for every row the host does
not force), every token, and the penalty window (as a multiset) after every chunk.

The scripted logits make the policy decide the outcome: a few favourite codes so the
repetition penalty (1.5 here, strong) keeps changing which codes win; EOS far on top at random
steps, and at the 25-frame cadence steps of turn-end chunks, so early EOS, EOS masking before
min_samples, the boundary masks and the forced EOS all occur. The plans cross condition
boundaries, a re-admission into another slot (rollover: the window moves with the request),
slot reuse by a new request, an empty chunk and a sample outside any chunk.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import Counter

import pytest
import torch

from backends.models.talker_policy import (
    CHUNK_BUDGETS,
    CODEC_EOS,
    ChunkBudget,
    ChunkKind,
    TalkerChunkPolicy,
    TalkerSamplingConfig,
)
from backends.runner.sampler import sample_token
from backends.runner.sampling_states import SamplingStates
from backends.runner.types import SampleContext
from backends.talker.policy_table import TalkerPolicyTable, penalty_powers

VOCAB = CODEC_EOS + 1
MAX_REQS = 8
SCRATCH = MAX_REQS
FAVOURITES = 24  # codes 0..23 get a bonus, so codes repeat inside the 16-code window
K = ChunkKind


@dataclasses.dataclass
class Sim:
    """One simulated request: its plan, host policy, slot, seed and position."""

    name: str
    plan: list[ChunkKind | str]  # chunk kinds; "readmit" moves it to a new slot
    host: TalkerChunkPolicy
    slot: int
    seed: int
    position: int = 10
    eos_rate: float = 0.1  # P(the scripted model wants EOS) at an ordinary step
    cadence_rate: float = 0.7  # ... at a turn-end cadence step (25-frame boundary + 0..6)
    tokens: list[int] = dataclasses.field(default_factory=list)
    in_chunk: bool = False


class Harness:
    def __init__(self, sampling: TalkerSamplingConfig, greedy: bool = False) -> None:
        self.sampling = sampling
        self.params = sampling.to_sampling_params()
        if greedy:
            self.params = dataclasses.replace(self.params, temperature=0.0)
        self.table = TalkerPolicyTable(MAX_REQS, "cpu", sampling, CODEC_EOS)
        self.states = SamplingStates(MAX_REQS, "cpu", self.table)
        self.free = [3, 6, 1, 7, 0, 5, 2, 4]  # slots handed out in this (scrambled) order
        self.rng = random.Random(5)

    def admit(self, sim: Sim) -> None:
        """What the runner (reset_slot, sampling params) and the engine (open) do."""
        sim.slot = self.free.pop(0)
        self.table.reset_slot(sim.slot)
        self.states.set(sim.slot, dataclasses.replace(self.params, seed=sim.seed))
        self.table.open(sim.slot)

    def readmit(self, sim: Sim) -> None:
        """A rollover / turn start: the request moves to another slot with its window."""
        history, old = self.table.history(sim.slot), sim.slot
        sim.slot = self.free.pop(0)
        self.free.append(old)
        self.table.reset_slot(sim.slot)
        self.states.set(sim.slot, dataclasses.replace(self.params, seed=sim.seed))
        self.table.open(sim.slot, history)
        sim.position = 3

    def logits(self, sim: Sim) -> torch.Tensor:
        """[VOCAB] float32 for the request's next sample, a function of (name, chunk step)."""
        step = sim.host.step
        gen = torch.Generator().manual_seed(zlib.crc32(f"{sim.name}/{len(sim.tokens)}".encode()))
        logits = torch.randn(VOCAB, generator=gen) * 2.0
        logits[:FAVOURITES] += 5.0
        cadence = step >= 25 and step % 25 < 7
        wants_eos = self.rng.random() < (sim.cadence_rate if cadence else sim.eos_rate)
        logits[CODEC_EOS] = 15.0 if wants_eos else -15.0
        return logits

    def host_sample(self, sim: Sim, logits: torch.Tensor) -> int:
        ctx = SampleContext(sim.name, sim.position, [])
        params = dataclasses.replace(self.params, seed=sim.seed)
        return sample_token(logits, params, ctx, sim.host)

    def step(self, sims: list[Sim]) -> None:
        """One batched device step over `sims` (plus two scratch padding rows)."""
        order = sims[:]
        self.rng.shuffle(order)
        rows = [self.logits(sim) for sim in order]
        pad = [torch.randn(VOCAB) for _ in range(2)]
        slots = torch.tensor([sim.slot for sim in order] + [SCRATCH, SCRATCH])
        positions = torch.tensor([sim.position for sim in order] + [1, 1])
        batch = torch.stack(rows + pad)
        processed = batch.clone()
        self.table.apply(processed, slots)
        for i, sim in enumerate(order):
            self.check_processed(sim, rows[i], processed[i])
        torch.testing.assert_close(processed[-2:], batch[-2:], rtol=0, atol=0)
        tokens = self.states.sample(batch.clone(), slots, positions).tolist()
        for i, sim in enumerate(order):
            expected = self.host_sample(sim, rows[i])
            assert tokens[i] == expected, (sim.name, len(sim.tokens), sim.host.step)
            sim.tokens.append(expected)
            sim.position += 1

    def check_processed(self, sim: Sim, raw: torch.Tensor, device_row: torch.Tensor) -> None:
        host_row = raw.clone()
        ctx = SampleContext(sim.name, sim.position, [])
        if sim.host.before_sample(host_row, ctx) is None:  # a forced row is never drawn
            assert torch.equal(device_row, host_row), (sim.name, sim.host.step)

    def window(self, slot: int) -> Counter[int]:
        ring = self.table.table[slot, 8:].tolist()
        return Counter(code for code in ring if code >= 0)


def run(harness: Harness, sims: list[Sim], starts: dict[str, int]) -> None:
    """Every request works through its plan; a request joins at its start step."""
    for tick in range(5000):
        for sim in sims:
            if tick == starts[sim.name]:
                harness.admit(sim)
            if tick >= starts[sim.name] and not sim.in_chunk and sim.plan:
                start_next(harness, sim)
        active = [sim for sim in sims if sim.in_chunk]
        if not active and all(tick >= starts[sim.name] for sim in sims):
            return
        if active:
            harness.step(active)
        for sim in active:
            if sim.host.is_chunk_done:
                sim.in_chunk = False
                assert harness.window(sim.slot) == Counter(sim.host.recent_codes), sim.name
    raise AssertionError("plans did not finish")


def start_next(harness: Harness, sim: Sim) -> None:
    item = sim.plan.pop(0)
    if item == "readmit":
        harness.readmit(sim)
        item = sim.plan.pop(0)
    if item == "outside":  # a sample with no chunk open: forced EOS on both paths
        sim.in_chunk = True
        return
    sim.host.begin_chunk(item)
    harness.table.begin_chunk(sim.slot, CHUNK_BUDGETS[item])
    sim.in_chunk = True


def make_sims(sampling: TalkerSamplingConfig) -> tuple[list[Sim], dict[str, int]]:
    plans: dict[str, tuple[list, float, float]] = {  # plan, eos_rate, cadence_rate
        "a": ([K.TURN_START, K.MID_TURN, K.MID_TURN, K.TURN_END], 0.15, 0.7),
        "b": (["outside", K.TURN_START, K.MID_TURN, "readmit", K.MID_TURN, K.TURN_END], 0.05, 0.7),
        "c": ([K.TURN_END, "readmit", K.TURN_START, K.EMPTY, K.MID_TURN], 0.0, 0.7),
        "d": ([K.TURN_START, K.TURN_START, K.TURN_END, K.TURN_END], 0.08, 0.7),
        "e": ([K.MID_TURN, K.EMPTY, K.TURN_END, "readmit", K.TURN_END], 0.02, 0.7),
        "f": ([K.TURN_END, K.MID_TURN, "readmit", K.TURN_END], 0.0, 0.0),  # to the forced EOS
        "g": ([K.TURN_END, K.TURN_END, K.MID_TURN, K.TURN_END], 0.0, 0.35),
    }
    sims = [
        Sim(name, list(plan), TalkerChunkPolicy(sampling), -1, 100 + i, 10, rate, cadence)
        for i, (name, (plan, rate, cadence)) in enumerate(plans.items())
    ]
    return sims, {"a": 0, "b": 0, "c": 3, "d": 17, "e": 40, "f": 1, "g": 2}


@pytest.mark.parametrize(
    "penalty,greedy", [(1.5, False), (1.05, False), (1.0, False), (1.5, True)]
)
def test_device_policy_matches_the_host_policy(penalty: float, greedy: bool) -> None:
    sampling = TalkerSamplingConfig(repetition_penalty=penalty)
    harness = Harness(sampling, greedy)
    sims, starts = make_sims(sampling)
    run(harness, sims, starts)
    lengths = {sim.name: len(sim.tokens) for sim in sims}
    assert min(lengths.values()) > 20
    eos_steps = [t == CODEC_EOS for sim in sims for t in sim.tokens]
    assert 10 < sum(eos_steps) < len(eos_steps) // 2
    assert harness.table.table[SCRATCH].tolist() == harness.table._off_row.tolist()


def test_slot_reuse_starts_a_new_request_with_an_empty_window() -> None:
    sampling = TalkerSamplingConfig(repetition_penalty=1.5)
    harness = Harness(sampling)
    first = Sim("first", [K.MID_TURN], TalkerChunkPolicy(sampling), -1, seed=1)
    run(harness, [first], {"first": 0})
    assert harness.window(first.slot)  # the finished request left codes in its window
    harness.free.insert(0, first.slot)  # the runner frees it; the next request gets it
    second = Sim("second", [K.MID_TURN, K.TURN_END], TalkerChunkPolicy(sampling), -1, seed=2)
    run(harness, [second], {"second": 0})
    assert second.slot == first.slot


@pytest.mark.parametrize(
    "budget",
    [*CHUNK_BUDGETS.values(), ChunkBudget(40, 10), ChunkBudget(90, 30, True, 3)],
    ids=[*(kind.value for kind in CHUNK_BUDGETS), "min10", "min30-masks3"],
)
def test_eos_mask_and_force_follow_the_budget_at_every_step(budget: ChunkBudget) -> None:
    """Budgets beyond the four in use too: mask = is_eos_masked(step), forced EOS =
    is_eos_forced(step), for every step of the chunk in one batch (one slot per step)."""
    steps = list(range(min(budget.max_samples, MAX_REQS * 14)))
    table = TalkerPolicyTable(len(steps), "cpu", TalkerSamplingConfig(), CODEC_EOS)
    for slot, step in enumerate(steps):
        table.open(slot)
        table.begin_chunk(slot, budget)
        table.table[slot, 5] = step  # the STEP column: `step` samples already drawn
    slots = torch.arange(len(steps))
    logits = torch.zeros(len(steps), VOCAB)
    table.apply(logits, slots)
    masked = torch.isinf(logits[:, CODEC_EOS]).tolist()
    assert masked == [budget.is_eos_masked(step) for step in steps]
    tokens = table.update(torch.zeros(len(steps), dtype=torch.int64), slots).tolist()
    assert [t == CODEC_EOS for t in tokens] == [budget.is_eos_forced(step) for step in steps]


def test_penalty_powers_are_the_host_scales() -> None:
    """The host computes pow(penalty, count) per code; the table looks the same values up."""
    counts = torch.randint(0, 17, (VOCAB,), generator=torch.Generator().manual_seed(0))
    for penalty in (1.05, 1.5, 2.0, 0.9, 1.3):
        host = torch.pow(torch.tensor(penalty, dtype=torch.float32), counts)
        assert torch.equal(penalty_powers(penalty, 16)[counts], host)


def test_unbounded_window_is_refused() -> None:
    with pytest.raises(ValueError, match="bounded penalty window"):
        TalkerPolicyTable(2, "cpu", TalkerSamplingConfig(penalty_window=0), CODEC_EOS)
