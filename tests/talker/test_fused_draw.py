"""The Talker's fused draw kernel (Triton, interpreted on CPU) against the torch path.

Strategy: two identical `TalkerPolicyTable`s, one drawn by the torch path (`SamplingStates`:
apply -> `sample_on_device` -> update, the reference), one by `FusedSamplingStates` (the
kernel). Every slot gets a random policy state (each chunk budget at its edge steps, done
or not, random penalty windows full of the favoured codes, policy off) and random logits; rows
are greedy, the Talker's sampling, or other parameters (no top-k, tiny top-p, top-k 1, top-k
past the vocabulary). Tokens and the whole table after the update must be identical. The one
allowed difference is a row whose draw float rounding may decide (`ambiguous`: a survivor's
softmax mass before it within 1e-6 of top_p, a tie group straddling top_p, or two noisy
scores within 1e-5: the interpreter's float64 log may differ from torch's CPU log by an ulp);
such rows are counted and must stay rare. Adversarial ties at the k-th value must all survive.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.models.talker_policy import CHUNK_BUDGETS, CHUNK_FRAMES, ChunkBudget, TalkerSamplingConfig
from backends.runner.device_sampler import gumbel_noise, step_seeds
from backends.runner.fused_draw import FusedSamplingStates, sampling_states_for
from backends.runner.sampling_states import SamplingStates
from backends.runner.types import SamplingParams
from backends.talker.policy_table import TalkerPolicyTable

pytestmark = pytest.mark.interpreter  # CPU tensors through the kernel (tests/interpreter_mark.py)
# Padded to 512 in the kernel (112 masked lanes). A top-p walk takes one interpreted pass per
# distinct value, so its time grows with the vocabulary; the real vocabulary runs in
# test_fused_draw_gpu.py. top-k VOCAB + 100 still falls between the vocabulary and the padding.
VOCAB = 400
EOS = VOCAB - 1
FAVOURITES = 30
TALKER = TalkerSamplingConfig()


def budget_states(every_step: bool = True) -> list[list[int]]:
    """[on, max, min, mask_after, mask_steps, step, done] for every step of every budget, or
    only its edge steps."""
    states = []
    for budget in CHUNK_BUDGETS.values():
        head = [1, budget.max_samples, budget.min_samples,
                int(budget.mask_eos_after_boundaries), budget.boundary_mask_steps]  # fmt: skip
        steps = range(budget.max_samples) if every_step else edge_steps(budget)
        states += [head + [step, 0] for step in steps]
        states.append(head + [budget.max_samples // 2, 1])  # the chunk's EOS was drawn
    return states


def edge_steps(budget: ChunkBudget) -> list[int]:
    """The first step and those on either side of each point where a rule of the budget
    changes: the EOS mask of min_samples, each boundary's mask window, the forced EOS."""
    edges = {0, budget.min_samples - 2, budget.min_samples - 1,
             budget.max_samples - 2, budget.max_samples - 1}  # fmt: skip
    for boundary in range(CHUNK_FRAMES, budget.max_samples, CHUNK_FRAMES):
        end = boundary + budget.boundary_mask_steps
        edges |= {boundary - 1, boundary, end - 1, end}
    return sorted(step for step in edges if 0 <= step < budget.max_samples)


class Pair:
    """The same slots drawn by the torch path and by the kernel."""

    def __init__(
        self, num_slots: int, sampling: TalkerSamplingConfig = TALKER, device: str = "cpu",
        eos: int = EOS,
    ) -> None:  # fmt: skip
        self.torch_table = TalkerPolicyTable(num_slots, device, sampling, eos)
        self.fused_table = TalkerPolicyTable(num_slots, device, sampling, eos)
        self.reference = SamplingStates(num_slots, device, self.torch_table)
        draw = self.fused_table.fused_draw
        assert draw is not None
        self.fused = FusedSamplingStates(num_slots, device, self.fused_table, draw)
        self.params: dict[int, SamplingParams] = {}

    def set(self, slot: int, params: SamplingParams, row: list[int] | None, ring) -> None:
        self.params[slot] = params
        for states in (self.reference, self.fused):
            states.set(slot, params)
        if row is not None:
            self.torch_table.table[slot, :7] = torch.tensor(row, device=ring.device)
            self.torch_table.table[slot, 7] = int(ring[0])
            self.torch_table.table[slot, 8:] = ring[1:]
        self.fused_table.table[slot] = self.torch_table.table[slot]

    def draw(self, logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor):
        """-> (torch tokens, fused tokens, the torch path's processed logits)."""
        processed = logits.clone()
        expected = self.reference.sample(processed, slots, positions)
        got = self.fused.sample(logits.clone(), slots, positions)
        return expected, got, processed


def random_ring(gen: torch.Generator, window: int, device: str = "cpu") -> torch.Tensor:
    """[1 + window]: head, then favoured codes (the penalty bites) or empty entries."""
    codes = torch.randint(0, FAVOURITES, (window,), generator=gen)
    empty = torch.rand(window, generator=gen) < 0.3
    head = torch.randint(0, window, (1,), generator=gen)
    return torch.cat([head, torch.where(empty, -1, codes)]).to(device)


def random_logits(
    gen: torch.Generator, rows: int, scale: float = 2.0, vocab: int = VOCAB
) -> torch.Tensor:
    """Favoured codes on top (the penalty decides among them); EOS on top in half the rows."""
    logits = torch.randn(rows, vocab, generator=gen) * scale
    logits[:, :FAVOURITES] += 4.0
    logits[:, vocab - 1] += torch.where(torch.rand(rows, generator=gen) < 0.5, 8.0, -2.0)
    return logits


def ambiguous(processed: torch.Tensor, params: SamplingParams, seed: torch.Tensor) -> bool:
    """Could float rounding decide this row's draw? (see the module docstring)"""
    if params.temperature == 0.0:
        return False
    vocab = processed.shape[0]
    s = processed / torch.tensor(params.temperature, dtype=torch.float32)
    values = torch.sort(s, descending=True).values
    k = params.top_k if 0 < params.top_k <= vocab else vocab
    keep = s >= values[k - 1]
    if params.top_p < 1.0:
        sorted_kept = values[values >= values[k - 1]].double()
        probs = torch.softmax(sorted_kept, 0)
        before = torch.cumsum(probs, 0) - probs
        if ((before - params.top_p).abs() < 1e-6).any():
            return True
        first = torch.searchsorted(-sorted_kept, -sorted_kept, side="left")  # a tie's first
        straddles = (before[first] < params.top_p) != (before < params.top_p)
        if straddles.any():
            return True
        keep &= s >= sorted_kept[before < params.top_p].min().float()
    noise = gumbel_noise(seed[None], vocab)[0]
    scores = torch.where(keep, s + noise, float("-inf")).double()
    top2 = torch.topk(scores, 2).values
    return bool(top2[0] - top2[1] < 1e-5 * max(1.0, abs(float(top2[0]))))


def compare(pair: Pair, logits, slots, positions) -> tuple[int, torch.Tensor]:
    """Assert equal tokens and tables except on ambiguous rows -> (their number, tokens)."""
    expected, got, processed = pair.draw(logits, slots, positions)
    seeds = step_seeds(pair.reference._ints.index_select(0, slots)[:, 1], positions)
    differ = (expected != got).nonzero().flatten().tolist()
    unclear = [r for r in range(len(slots))
               if ambiguous(processed[r], pair.params[int(slots[r])], seeds[r])]  # fmt: skip
    assert set(differ) <= set(unclear), f"rows {differ} differ, only {unclear} are ambiguous"
    clear = torch.ones(pair.torch_table.table.shape[0], dtype=torch.bool, device=slots.device)
    clear[slots[differ]] = False
    assert torch.equal(pair.torch_table.table[clear], pair.fused_table.table[clear])
    return len(unclear), got


def budget_pair(gen: torch.Generator, device: str = "cpu", eos: int = EOS, every_step: bool = True):
    """A pair over the budget states (Talker sampling), greedy and policy-off rows, the
    scratch slot and padding rows -> (pair, slots in a random order, positions)."""
    states, extra = budget_states(every_step), 12
    scratch = len(states) + extra
    pair = Pair(scratch, device=device, eos=eos)
    talker = TALKER.to_sampling_params()
    for slot, row in enumerate(states):
        ring = random_ring(gen, 16, device)
        pair.set(slot, dataclasses.replace(talker, seed=slot), row, ring)
    for slot in range(len(states), scratch):
        params = dataclasses.replace(talker, seed=slot, temperature=0.8 * (slot % 2))
        row = states[slot % len(states)] if slot % 3 else None  # None: the policy stays off
        pair.set(slot, params, row, random_ring(gen, 16, device))
    pair.set(scratch, SamplingParams(), None, None)  # the scratch slot's greedy defaults
    slots = torch.cat([torch.randperm(scratch + 1, generator=gen), torch.full((3,), scratch)])
    positions = torch.randint(0, 10_000, (len(slots),), generator=gen)
    return pair, slots.to(device), positions.to(device)


def test_budget_edge_states_draw_the_torch_tokens() -> None:
    """Each row is an interpreted program: the edge steps here, every step on the GPU
    (test_fused_draw_gpu.py)."""
    gen = torch.Generator().manual_seed(11)
    pair, slots, positions = budget_pair(gen, every_step=False)
    unclear, _ = compare(pair, random_logits(gen, len(slots)), slots, positions)
    assert unclear <= 2
    assert (pair.fused_table.table[:, 5] != 0).any()  # counters moved


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=-1, top_p=1.0, seed=3),  # pure Gumbel draw
        SamplingParams(temperature=0.3, top_k=-1, top_p=0.6, seed=4),  # nucleus, no top-k
        SamplingParams(temperature=1.0, top_k=1, top_p=0.85, seed=5),
        SamplingParams(temperature=2.0, top_k=VOCAB + 100, top_p=0.7, seed=6),
        SamplingParams(temperature=1.5, top_k=25, top_p=0.05, seed=7),
        SamplingParams(temperature=0.0, top_k=25, top_p=0.85, seed=8),
        SamplingParams(temperature=1.0, top_k=100, top_p=0.9, seed=9),  # past the cache
    ],
    ids=["gumbel", "nucleus", "top1", "k-past-vocab", "tiny-p", "greedy", "k100"],
)
def test_other_sampling_parameters(params: SamplingParams) -> None:
    gen = torch.Generator().manual_seed(params.seed)
    # Without a top-k inside the vocabulary, top-p walks every distinct value (V passes over
    # the row), and a top-k past the kernel's cache of 32 takes k passes: slow in the
    # interpreter for 18 rows; 6 rows still span the budgets.
    walks_vocab = params.top_p < 1.0 and not 0 < params.top_k < VOCAB
    many_passes = params.temperature > 0 and (walks_vocab or params.top_k > 32)
    states = budget_states()[:: 27 if many_passes else 9]
    pair = Pair(len(states))
    for slot, row in enumerate(states):
        pair.set(slot, dataclasses.replace(params, seed=slot), row, random_ring(gen, 16))
    slots = torch.arange(len(states))
    positions = torch.randint(0, 10_000, (len(slots),), generator=gen)
    logits = random_logits(gen, len(slots), scale=6.0 if params.top_p < 0.9 else 2.0)
    assert compare(pair, logits, slots, positions)[0] <= 1


def tied_logits(gen: torch.Generator, rows: int, k: int, ties: int) -> torch.Tensor:
    """k - 3 distinct top values, then `ties` codes tied at the k-th value, the rest far
    below; the tie group's codes are spread over the vocabulary."""
    logits = torch.full((rows, VOCAB), -20.0) + torch.rand(rows, VOCAB, generator=gen)
    for r in range(rows):
        order = torch.randperm(VOCAB - 1, generator=gen)
        logits[r, order[: k - 3]] = torch.linspace(3.0, 1.0, k - 3)
        logits[r, order[k - 3 : k - 3 + ties]] = 0.5
    return logits


@pytest.mark.parametrize("top_p", [1.0, 0.999])
def test_ties_at_the_kth_value_all_survive(top_p: float) -> None:
    gen = torch.Generator().manual_seed(21)
    rows, ties = 32, 9
    sampling = dataclasses.replace(TALKER, repetition_penalty=1.0)  # keep the ties exact
    pair = Pair(rows, sampling)
    params = SamplingParams(temperature=6.0, top_k=TALKER.top_k, top_p=top_p)
    for slot in range(rows):
        pair.set(slot, dataclasses.replace(params, seed=slot), None, None)
    logits = tied_logits(gen, rows, TALKER.top_k, ties)
    slots, positions = torch.arange(rows), torch.arange(rows) * 7
    unclear, got = compare(pair, logits, slots, positions)
    assert unclear == 0
    picked = logits.gather(1, got[:, None])[:, 0]
    assert (picked == 0.5).sum() >= 6  # the high temperature draws from the tie group
    tied = logits == 0.5
    ranks = (tied.cumsum(1) + TALKER.top_k - 4).gather(1, got[:, None])[:, 0]
    assert ((picked == 0.5) & (ranks >= TALKER.top_k)).any()  # a tie past the k-th kept


def test_the_fused_draw_is_picked_on_cuda_only() -> None:
    table = TalkerPolicyTable(2, "cpu", TALKER, EOS)
    assert type(sampling_states_for(2, "cpu", table)) is SamplingStates  # CPU: the reference
    assert type(sampling_states_for(2, "cpu", None)) is SamplingStates
    assert TalkerPolicyTable(2, "cpu", TALKER, EOS, fused=False).fused_draw is None
