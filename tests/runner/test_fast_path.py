"""The fast path (backend "triton") against the reference path, on CPU.

Strategy: two runners over the same tiny Qwen3 weights, one per backend; Triton's interpreter
runs the kernels here and CUDA graphs are off, so the graphed-decode code path runs eagerly
over its persistent buffers. Every scenario drives both runners with identical inputs: mixed
append/prefill/decode batches in non-slot order with injected embeddings, decode batches
padded to a bucket, seeded sampling with filters (same counter noise on both paths), hooked
rows (sampled on the host), and `launch_step` settling. Padding rows must write only the pad
block. Skipped where Triton is not installed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import SampleContext, SamplingParams, StepInput  # noqa: E402

HIDDEN_ATOL = 2e-5  # float32 on both paths; fused kernels only reorder sums
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def pair(make_runner) -> Callable[..., tuple[ModelRunner, ModelRunner]]:
    def build(**overrides: object) -> tuple[ModelRunner, ModelRunner]:
        settings = dict(num_blocks=64, max_num_reqs=6, max_model_len=48, **overrides)
        return (
            make_runner(attention_backend="reference", **settings),
            make_runner(attention_backend="triton", **settings),
        )

    return build


def step_both(ref: ModelRunner, fast: ModelRunner, inputs: list[StepInput]) -> list[int | None]:
    expected, got = ref.step(inputs), fast.step(inputs)
    for e, g in zip(expected, got):
        assert (g.request_id, g.positions, g.token) == (e.request_id, e.positions, e.token)
        assert (g.hidden is None) == (e.hidden is None)
        if e.hidden is not None:
            torch.testing.assert_close(g.hidden, e.hidden, atol=HIDDEN_ATOL, rtol=0)
    return [g.token for g in got]


def add_both(runners: tuple[ModelRunner, ...], request_id: str, params: SamplingParams) -> None:
    for runner in runners:
        runner.add_request(request_id, params)


@pytest.mark.interpreter
def test_mixed_batches_then_padded_decodes(pair, qwen3) -> None:
    ref, fast = pair()
    for i in range(5):
        add_both((ref, fast), f"r{i}", SamplingParams())
    injected = qwen3.embed_tokens(torch.tensor([4, 5, 6])).detach()
    first = [
        StepInput("r3", [9] * 7, capture_hidden=True),
        StepInput("r0", [1, 2, 3], injected, capture_hidden=True),  # placeholder ids
        StepInput("r1", [8] * 5, sample=False),
        StepInput("r2", [3]),
    ]
    tokens = dict(zip(["r3", "r0", "r1", "r2"], step_both(ref, fast, first)))
    second = [StepInput("r1", [7, 7], capture_hidden=True), StepInput("r4", [2] * 6)]
    tokens.update(zip(["r1", "r4"], step_both(ref, fast, second)))
    for batch in (["r4", "r2", "r0"], ["r0", "r1", "r2", "r3", "r4"], ["r3"]):  # buckets 4, 6, 1
        inputs = [StepInput(rid, [tokens[rid]], capture_hidden=True) for rid in batch]
        tokens.update(zip(batch, step_both(ref, fast, inputs)))


@pytest.mark.interpreter
def test_seeded_filtered_sampling_and_slot_reuse(pair) -> None:
    ref, fast = pair()
    params = SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=21)
    add_both((ref, fast), "a", params)
    add_both((ref, fast), "b", SamplingParams(temperature=1.2, seed=2))
    feed = {"a": [5, 6, 7], "b": [9]}
    for _ in range(3):
        inputs = [StepInput(rid, ids) for rid, ids in feed.items()]
        feed = {rid: [t] for rid, t in zip(feed, step_both(ref, fast, inputs))}
    for runner in (ref, fast):
        runner.free_request("a")
    add_both((ref, fast), "c", SamplingParams(temperature=1.0, seed=5))  # reuses a's slot
    feed = {"c": [1, 2], "b": feed["b"]}
    for _ in range(2):
        inputs = [StepInput(rid, ids) for rid, ids in feed.items()]
        feed = {rid: [t] for rid, t in zip(feed, step_both(ref, fast, inputs))}


class BanHook:
    """Bans token `banned` and records positions; a host-only policy."""

    def __init__(self, banned: int) -> None:
        self.banned = banned
        self.positions: list[int] = []

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        self.positions.append(ctx.position)
        logits[self.banned] = float("-inf")
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


@pytest.mark.interpreter
def test_hooked_and_penalised_rows_sample_on_host(pair) -> None:
    ref, fast = pair()
    hooks = []
    for runner in (ref, fast):
        probe = runner.step  # the banned id is whatever greedy picks first, so the ban bites
        runner.add_request("p", SamplingParams())
        banned = probe([StepInput("p", [3, 4])])[0].token
        runner.free_request("p")
        hooks.append(BanHook(banned))
        runner.add_request("h", SamplingParams(), hook=hooks[-1])
        runner.add_request("pen", SamplingParams(temperature=0.8, repetition_penalty=1.5, seed=1))
        runner.add_request("d", SamplingParams())
    feed = {"h": [3, 4], "pen": [5], "d": [6]}
    for _ in range(3):
        inputs = [StepInput(rid, ids) for rid, ids in feed.items()]
        feed = {rid: [t] for rid, t in zip(feed, step_both(ref, fast, inputs))}
    assert hooks[0].positions == hooks[1].positions == [2, 3, 4]
    assert hooks[1].banned not in fast.states.generated[fast.states.slot_of("h")]


@pytest.mark.interpreter
def test_launch_step_is_settled_by_the_next_call(pair) -> None:
    _, fast = pair()
    fast.add_request("a", SamplingParams())
    pending = fast.launch_step([StepInput("a", [1, 2, 3])])
    assert fast.num_tokens("a") == 3  # the ledger advances at launch
    fast.add_request("b", SamplingParams())  # settles the pending step first
    assert pending.is_finished
    token = pending.wait()[0].token
    assert fast.states.generated[fast.states.slot_of("a")] == [token]


@pytest.mark.interpreter
def test_padding_rows_write_only_the_pad_block(pair) -> None:
    _, fast = pair()
    for rid in ("a", "b", "c"):
        fast.add_request(rid, SamplingParams())
        fast.step([StepInput(rid, [1, 2, 3, 4, 5])])
    before = fast.kv.data.clone()
    fast.step([StepInput(rid, [7]) for rid in ("a", "b", "c")])  # 3 rows in bucket 4
    changed = (fast.kv.data != before).flatten(4).any(-1)  # [layers, 2, blocks, block_size]
    pad_block = fast.config.num_blocks
    written = {(fast.block_ids(rid)[5 // 4], 5 % 4) for rid in ("a", "b", "c")}
    rows = changed.any(0).any(0)  # [blocks, block_size]
    for block, offset in rows.nonzero().tolist():
        assert block == pad_block or (block, offset) in written, (block, offset)
    assert all(rows[block, offset] for block, offset in written)
    assert rows[pad_block, 0], "the padding row wrote nothing: is it really padded?"


@pytest.mark.interpreter
def test_a_step_where_no_input_samples(pair, qwen3) -> None:
    """The Thinker's setup append: a prefill alone (injected rows, longer than a mixed-graph
    query) that samples nothing; the next append continues from its KV on both paths."""
    ref, fast = pair()
    add_both((ref, fast), "s", SamplingParams())
    injected = qwen3.embed_tokens(torch.tensor(list(range(40)))).detach()
    for runner in (ref, fast):
        (result,) = runner.step([StepInput("s", [0] * 40, injected, sample=False)])
        assert result.token is None and result.hidden is None
    follow = [StepInput("s", [7, 8, 9], capture_hidden=True)]
    got, want = fast.step(follow)[0], ref.step(follow)[0]
    assert got.token == want.token and got.positions == want.positions == [40, 41, 42]
    torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-4, atol=1e-4)


@pytest.mark.interpreter
def test_admissions_reach_the_sampling_table_in_two_copies_at_the_next_forward(
    pair, monkeypatch
) -> None:
    """Admitting requests queues no copy; the next forward publishes all their sampling params
    at once (one copy per table), before it runs (a graph replay would read the table as is),
    and a forward with no admission since publishes nothing."""
    from backends.runner import sampling_states

    copies = []
    real_copy = sampling_states.copy_to_device
    monkeypatch.setattr(sampling_states, "copy_to_device",
                        lambda dst, array: copies.append(dst.shape) or real_copy(dst, array))  # fmt: skip
    ref, fast = pair()
    params = [SamplingParams(temperature=0.8, top_k=5, seed=7), SamplingParams(),
              SamplingParams(temperature=1.2, top_p=0.7, seed=3)]  # fmt: skip
    for i, p in enumerate(params):
        add_both((ref, fast), f"r{i}", p)
    assert copies == []
    inputs = [StepInput(f"r{i}", [3 + i, 4, 5]) for i in range(3)]
    pending = fast.launch_step(inputs)
    assert len(copies) == 2  # queued with the forward, before anything is read back
    expected = [r.token for r in ref.step(inputs)]
    assert [r.token for r in pending.wait()] == expected
    for _ in range(3):
        inputs = [StepInput(r.request_id, [r.token]) for r in fast.step(inputs)]
    assert len(copies) == 2
