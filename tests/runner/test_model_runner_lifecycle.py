"""Property test of the runner's slot and block lifecycle under random request traffic.

Strategy: hypothesis drives random sequences of add / mixed step (appends of many rows and
1-row decodes, sampling or not) / reanchor / finish / cancel against a small pool, so slots and
blocks are recycled constantly and admission sometimes fails. After every operation the block
accounting must be exact (every block either free or owned by exactly one live request, each
request owning exactly its reservation). Every request's recorded operations are then replayed
alone in a fresh runner: hidden states and sampled tokens must match, which fails if any state
(KV, token history, penalties, seeds, hooks) leaked across requests or into a recycled slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.runner.model_runner import ModelRunner
from backends.runner.types import AdmissionError, SampleContext, SamplingParams, StepInput

BLOCK_SIZE = 4
NUM_BLOCKS = 20
MAX_MODEL_LEN = 24
RUNNER_SETTINGS = dict(
    num_blocks=NUM_BLOCKS, max_num_reqs=4, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE
)
# Batch shape only changes float32 summation order between the shared and the solo run.
HIDDEN_ATOL = 2e-5
VOCAB = 300
# Weighted towards steps so requests live long enough to fill pages, get re-anchored and
# have their slots recycled with history behind them.
OP_MIX = ["add", "step", "step", "step", "step", "step", "step", "reanchor", "finish", "cancel"]


class RecordingHook:
    """Records what each sample saw, so leaked history or a shared hook shows up directly."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, tuple[int, ...]]] = []  # (position, generated history)

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        self.seen.append((ctx.position, tuple(ctx.generated)))
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


@dataclass
class Tracked:
    params: SamplingParams
    max_len: int
    hook: RecordingHook
    ops: list[StepInput | tuple[int, int]] = field(default_factory=list)  # step or reanchor
    outputs: list[tuple[torch.Tensor | None, int | None]] = field(default_factory=list)
    num_tokens: int = 0


def check_block_accounting(runner: ModelRunner, live: dict[str, Tracked]) -> None:
    rows = {rid: runner.block_ids(rid) for rid in live}
    owned = [block for row in rows.values() for block in row]
    assert len(owned) == len(set(owned)), f"a KV block is shared: {rows}"
    assert sorted(owned + runner.block_pool.free_block_ids()) == list(range(NUM_BLOCKS))
    for rid, tracked in live.items():
        assert len(rows[rid]) == -(-tracked.max_len // BLOCK_SIZE), rid
        assert runner.num_tokens(rid) == tracked.num_tokens, rid
    assert runner.states.num_active == len(live)


def do_add(runner: ModelRunner, data: st.DataObject, live: dict, rid: str) -> Tracked | None:
    max_len = data.draw(st.sampled_from([MAX_MODEL_LEN, 16, 9, 1]), label="max_len")
    params = SamplingParams(
        temperature=data.draw(st.sampled_from([0.0, 1.0])),
        top_k=data.draw(st.sampled_from([-1, 20])),
        repetition_penalty=1.5,
        seed=data.draw(st.integers(0, 1000)),
    )
    fits = runner.states.num_free_slots > 0 and runner.num_free_blocks() >= -(
        -max_len // BLOCK_SIZE
    )
    hook = RecordingHook()
    try:
        runner.add_request(rid, params, hook=hook, max_len=max_len)
    except AdmissionError:
        assert not fits
        return None
    assert fits and runner.token_ids(rid) == [] and runner.states.generated[
        runner.states.slot_of(rid)
    ] == []
    return Tracked(params, max_len, hook)


def draw_input(data: st.DataObject, rid: str, tracked: Tracked) -> StepInput | None:
    room = tracked.max_len - tracked.num_tokens
    if room == 0:
        return None
    num_rows = min(room, data.draw(st.sampled_from([1, 1, 1, 2, 5, room]), label="rows"))
    ids = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=num_rows, max_size=num_rows))
    return StepInput(rid, ids, None, sample=data.draw(st.booleans()), capture_hidden=True)


def do_step(runner: ModelRunner, data: st.DataObject, live: dict[str, Tracked]) -> None:
    chosen = data.draw(st.lists(st.sampled_from(sorted(live)), unique=True, min_size=1))
    inputs = [inp for rid in chosen if (inp := draw_input(data, rid, live[rid])) is not None]
    for inp, result in zip(inputs, runner.step(inputs)):
        tracked = live[inp.request_id]
        tracked.ops.append(inp)
        tracked.outputs.append((result.hidden, result.token))
        tracked.num_tokens += inp.num_rows


def do_reanchor(runner: ModelRunner, data: st.DataObject, tracked: Tracked, rid: str) -> None:
    num_pages = tracked.num_tokens // BLOCK_SIZE
    if num_pages == 0:
        return
    keep = BLOCK_SIZE * data.draw(st.integers(0, num_pages - 1), label="keep_pages")
    drop = BLOCK_SIZE * data.draw(st.integers(1, num_pages - keep // BLOCK_SIZE))
    runner.reanchor(rid, keep, drop)
    tracked.ops.append((keep, drop))
    tracked.num_tokens -= drop


def replay_alone(make_runner, rid: str, tracked: Tracked) -> None:
    solo = make_runner(**RUNNER_SETTINGS)
    hook = RecordingHook()
    solo.add_request(rid, tracked.params, hook=hook, max_len=tracked.max_len)
    outputs = iter(tracked.outputs)
    for op in tracked.ops:
        if isinstance(op, tuple):
            solo.reanchor(rid, *op)
            continue
        (result,) = solo.step([op])
        hidden, token = next(outputs)
        torch.testing.assert_close(result.hidden, hidden, atol=HIDDEN_ATOL, rtol=0)
        assert result.token == token, f"{rid}: sampled token differs from the solo run"
    assert hook.seen == tracked.hook.seen, f"{rid}: sampling context differs from the solo run"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_lifecycle_has_no_leaks(make_runner, data: st.DataObject) -> None:
    runner = make_runner(**RUNNER_SETTINGS)
    live: dict[str, Tracked] = {}
    done: dict[str, Tracked] = {}
    for op_index in range(data.draw(st.integers(10, 40), label="num_ops")):
        op = data.draw(st.sampled_from(OP_MIX), label="op") if live else "add"
        if op == "add" and runner.states.num_free_slots == 0 and data.draw(st.booleans()):
            op = "step"  # mostly keep stepping a full runner; sometimes test the refusal
        if op == "add":
            tracked = do_add(runner, data, live, f"q{op_index}")
            if tracked is not None:
                live[f"q{op_index}"] = tracked
        elif op == "step":
            do_step(runner, data, live)
        else:
            rid = data.draw(st.sampled_from(sorted(live)), label="rid")
            if op == "reanchor":
                do_reanchor(runner, data, live[rid], rid)
            else:  # finish and cancel both free; cancel also frees twice (idempotent)
                runner.free_request(rid)
                if op == "cancel":
                    runner.free_request(rid)
                done[rid] = live.pop(rid)
        check_block_accounting(runner, live)
    for rid in list(live):
        runner.free_request(rid)
        done[rid] = live.pop(rid)
    assert runner.num_free_blocks() == NUM_BLOCKS and runner.states.num_free_slots == 4
    for rid, tracked in done.items():
        replay_alone(make_runner, rid, tracked)
