"""The runner's device logits processor against the equivalent host hook, on CPU.

Strategy: a toy processor (per slot: a banned token masked to -inf, and a countdown after
which the draw is replaced by a forced token) and a host hook with the same semantics. Three
runners over the same tiny Qwen3 get the same steps: the reference path with hooks (the
oracle), the reference path with the processor, and the fast path (Triton interpreted, its
graph buffers run eagerly, so decode batches sample through the sampling-graph code) with the
processor. Batches mix prefills and padded decodes, seeded filtered sampling and greedy rows,
a hooked row and an HF-penalised row (both bypass the processor), rows whose slot the
processor does not manage, and slot reuse (the processor's `reset_slot`). Every token must be
identical, and the scratch slot used by padding rows must stay untouched.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import (  # noqa: E402
    RunnerConfig,
    SampleContext,
    SamplingParams,
    StepInput,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MAX_REQS = 6
FORCED = 7


class CountdownBan:
    """DeviceLogitsProcessor: [slots + 1, 3] int64 rows of (on, banned token, countdown)."""

    def __init__(self, max_num_reqs: int) -> None:
        self.state = torch.zeros(max_num_reqs + 1, 3, dtype=torch.int64)
        self.resets: list[int] = []

    def reset_slot(self, slot: int) -> None:
        self.resets.append(slot)
        self.state[slot] = 0

    def configure(self, slot: int, banned: int, countdown: int) -> None:
        self.state[slot] = torch.tensor([1, banned, countdown])

    def apply(self, logits: torch.Tensor, slots: torch.Tensor) -> None:
        rows = self.state.index_select(0, slots)
        banned = rows[:, 1:2]
        kept = logits.gather(1, banned)
        logits.scatter_(1, banned, torch.where(rows[:, :1] != 0, float("-inf"), kept))

    def update(self, tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        rows = self.state.index_select(0, slots)
        is_on = rows[:, 0] != 0
        tokens = torch.where(is_on & (rows[:, 2] == 0), FORCED, tokens)
        rows[:, 2] -= is_on.to(torch.int64)
        self.state.index_copy_(0, slots, rows)
        return tokens


@dataclasses.dataclass
class CountdownBanHook:
    """The same policy as a host hook, for one request."""

    banned: int
    countdown: int

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        logits[self.banned] = float("-inf")
        return FORCED if self.countdown == 0 else None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        self.countdown -= 1
        return token


class BanOnly(CountdownBanHook):
    """A host-only hook on another request (never sees the processor)."""

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        logits[self.banned] = float("-inf")
        return None


SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=11)
REQUESTS = {  # request id -> (params, policy: (banned, countdown) or None, host-only hook)
    "p1": (SEEDED, (4, 3), False),
    "p2": (SamplingParams(), (9, 5), False),  # greedy
    "free": (dataclasses.replace(SEEDED, seed=3), None, False),  # processor off in its slot
    "hook": (SamplingParams(temperature=1.1, seed=5), (2, -1), True),
    "pen": (dataclasses.replace(SEEDED, repetition_penalty=1.4, seed=8), None, False),
}


class Trio:
    """Reference + hooks, reference + processor, fast path + processor."""

    def __init__(self, qwen3) -> None:
        settings = dict(num_blocks=64, max_num_reqs=MAX_REQS, max_model_len=48, block_size=4)
        self.processors = [CountdownBan(MAX_REQS), CountdownBan(MAX_REQS)]
        self.runners = [
            ModelRunner(qwen3, RunnerConfig(**settings)),
            ModelRunner(qwen3, RunnerConfig(**settings), self.processors[0]),
            ModelRunner(qwen3, RunnerConfig(attention_backend="triton", **settings),
                        self.processors[1]),
        ]  # fmt: skip

    def add(self, request_id: str, params: SamplingParams, policy, host_only: bool) -> None:
        hook_type = BanOnly if host_only else CountdownBanHook
        oracle_hook = None if policy is None else hook_type(*policy)
        self.runners[0].add_request(request_id, params, oracle_hook)
        for runner, processor in zip(self.runners[1:], self.processors):
            runner.add_request(request_id, params, BanOnly(*policy) if host_only else None)
            slot = runner.states.slot_of(request_id)
            if policy is not None and not host_only:
                processor.configure(slot, *policy)

    def step(self, inputs: list[StepInput]) -> list[int | None]:
        results = [[r.token for r in runner.step(inputs)] for runner in self.runners]
        assert results[1] == results[0], "reference + processor != reference + hook"
        assert results[2] == results[0], "fast path + processor != reference + hook"
        return results[0]

    def free(self, request_id: str) -> None:
        for runner in self.runners:
            runner.free_request(request_id)


@pytest.mark.interpreter
def test_processor_matches_the_host_hook_on_both_paths(qwen3) -> None:
    trio = Trio(qwen3)
    for request_id, (params, policy, host_only) in REQUESTS.items():
        trio.add(request_id, params, policy, host_only)
    prompts = {"p1": [3, 4, 5], "p2": [6], "free": [1, 2], "hook": [8, 9, 10, 11], "pen": [5]}
    tokens = trio.step([StepInput(rid, ids) for rid, ids in prompts.items()])
    feed = dict(zip(prompts, tokens))
    for batch in [["p2", "p1", "free"]] * 3 + [list(REQUESTS)] * 4 + [["pen", "p1"]] * 2:
        out = trio.step([StepInput(rid, [feed[rid]]) for rid in batch])  # buckets 4, 6, 2
        feed.update(zip(batch, out))
    generated = trio.runners[0].states.generated
    assert FORCED in generated[trio.runners[0].states.slot_of("p1")][3:5]
    for processor in trio.processors:
        assert processor.state[MAX_REQS].tolist() == [0, 0, 0]  # the scratch slot


@pytest.mark.interpreter
def test_reused_slot_starts_with_the_processor_off(qwen3) -> None:
    trio = Trio(qwen3)
    trio.add("p1", SEEDED, (4, 1), False)
    feed = {"p1": trio.step([StepInput("p1", [3, 4])])[0]}
    feed["p1"] = trio.step([StepInput("p1", [feed["p1"]])])[0]
    assert feed["p1"] == FORCED
    slot = trio.runners[1].states.slot_of("p1")
    trio.free("p1")
    trio.add("next", SEEDED, None, False)  # takes p1's slot; its countdown must not carry
    assert trio.runners[1].states.slot_of("next") == slot
    assert all(processor.resets[-1] == slot for processor in trio.processors)
    token = trio.step([StepInput("next", [3, 4])])[0]
    for _ in range(4):
        token = trio.step([StepInput("next", [token])])[0]
