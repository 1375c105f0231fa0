"""Decode chains (`ModelRunner.decode_chain`) against single decode steps, on CPU.

Strategy: two fast-path runners (Triton interpreted, graphs off, so the chain's ops run
eagerly over the decode buffers: the very ops a chain graph records) over the same tiny Qwen3
get the same prompts; one then single-steps K times, feeding each drawn token back, the other
runs one chain of K. Tokens, positions, ledgers, drawn histories and the KV rows of every
request must be identical, and a later step capturing hidden rows must agree, for requests of
different context lengths (crossing pages) with seeded filtered sampling. Truncating a chain
after a row's "stop" must leave exactly the state of single stepping to that stop. Padding
rows write only the pad block; inputs that cannot chain are refused with nothing changed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import SamplingParams, StepInput  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PROMPTS = {"a": [1, 2, 3], "b": [4] * 9, "c": [5, 6, 7, 8, 9, 10, 11]}
PARAMS = {
    "a": SamplingParams(),
    "b": SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=21),
    "c": SamplingParams(temperature=1.2, seed=2),
}


@pytest.fixture
def pair(make_runner) -> tuple[ModelRunner, ModelRunner]:
    """Two fast runners after the same prefills; returns them and each request's next id."""
    runners = tuple(
        make_runner(attention_backend="triton", num_blocks=64, max_num_reqs=6, max_model_len=48)
        for _ in range(2)
    )
    for runner in runners:
        for rid, prompt in PROMPTS.items():
            runner.add_request(rid, PARAMS[rid], max_len=len(prompt) + 20)
        runner.step([StepInput(rid, prompt) for rid, prompt in PROMPTS.items()])
    return runners  # type: ignore[return-value]


def next_ids(runner: ModelRunner) -> dict[str, int]:
    return {rid: runner.states.generated[runner.states.slot_of(rid)][-1] for rid in PROMPTS}


def single_steps(runner: ModelRunner, feed: dict[str, int], steps: int) -> dict[str, list[int]]:
    drawn: dict[str, list[int]] = {rid: [] for rid in feed}
    for _ in range(steps):
        results = runner.step([StepInput(rid, [token]) for rid, token in feed.items()])
        feed = {r.request_id: r.token for r in results}
        for rid, token in feed.items():
            drawn[rid].append(token)
    return drawn


def kv_rows(runner: ModelRunner, request_id: str) -> torch.Tensor:
    """[layers, 2, tokens, heads, head_dim] the request's K/V rows now in KV, in order."""
    blocks = torch.tensor(runner.block_ids(request_id))
    data = runner.kv.data[:, :, blocks].flatten(2, 3)
    return data[:, :, : runner.num_tokens(request_id)]


def assert_close(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    """Exact where both sides ran the same batch shapes; float32 rounding apart otherwise."""
    torch.testing.assert_close(got, want, atol=0 if exact else 2e-5, rtol=0 if exact else 1e-5)


def assert_same_state(got: ModelRunner, want: ModelRunner, exact: bool = True) -> None:
    for rid in PROMPTS:
        assert got.num_tokens(rid) == want.num_tokens(rid)
        assert got.token_ids(rid) == want.token_ids(rid)
        slot_got, slot_want = got.states.slot_of(rid), want.states.slot_of(rid)
        assert got.states.generated[slot_got] == want.states.generated[slot_want]
        assert_close(kv_rows(got, rid), kv_rows(want, rid), exact)


def assert_same_next_step(got: ModelRunner, want: ModelRunner, exact: bool = True) -> None:
    inputs = [StepInput(rid, [token], capture_hidden=True) for rid, token in next_ids(want).items()]
    for g, w in zip(got.step(inputs), want.step(inputs)):
        assert (g.token, g.positions) == (w.token, w.positions)
        assert_close(g.hidden, w.hidden, exact)


@pytest.mark.parametrize("length", [1, 2, 5])
@pytest.mark.interpreter
def test_chain_equals_single_steps(pair, length: int) -> None:
    stepped, chained = pair
    expected = single_steps(stepped, next_ids(stepped), length)
    feed = next_ids(chained)
    results = chained.decode_chain([StepInput(rid, [t]) for rid, t in feed.items()], length)
    for result in results:
        assert result.tokens == expected[result.request_id]
        start = len(PROMPTS[result.request_id])
        assert result.positions == list(range(start, start + length))
    assert_same_state(chained, stepped)
    assert_same_next_step(chained, stepped)


@pytest.mark.interpreter
def test_truncation_after_a_stop_equals_stepping_to_it(pair) -> None:
    """Rows "stop" after 2, 5 and 3 draws of a 6-step chain; the rest is discarded. The
    single steps run one request at a time (bucket 1, not the chain's 4): KV within rounding."""
    stepped, chained = pair
    accepted = {"a": 2, "b": 5, "c": 3}
    feed = next_ids(stepped)
    for rid, count in accepted.items():
        single_steps(stepped, {rid: feed[rid]}, count)
    results = chained.decode_chain([StepInput(rid, [t]) for rid, t in feed.items()], 6)
    for result in results:
        chained.discard_tail(result.request_id, 6 - accepted[result.request_id])
    assert_same_state(chained, stepped, exact=False)
    assert_same_next_step(chained, stepped, exact=False)
    with pytest.raises(ValueError, match="cannot discard"):
        chained.discard_tail("a", 1)  # a step came after the chain


@pytest.mark.interpreter
def test_padding_rows_write_only_the_pad_block_and_requests_their_own(pair) -> None:
    _, chained = pair
    before = chained.kv.data.clone()
    feed = next_ids(chained)
    chained.decode_chain([StepInput(rid, [t]) for rid, t in feed.items()], 4)  # 3 rows, bucket 4
    rows = (chained.kv.data != before).flatten(4).any(-1).any(0).any(0)  # [blocks, block_size]
    owned = {block for rid in PROMPTS for block in chained.block_ids(rid)}
    pad_block = chained.config.num_blocks
    for block, _ in rows.nonzero().tolist():
        assert block == pad_block or block in owned, block
    assert rows[pad_block, 0], "the padding row wrote nothing: is it really padded?"


@pytest.mark.interpreter
def test_chains_past_the_reservation_or_of_other_rows_are_refused(pair, qwen3) -> None:
    _, chained = pair
    feed = next_ids(chained)
    room = chained.num_free_rows("a")
    assert room == 20
    embeds = qwen3.embed_tokens(torch.tensor([3])).detach()
    bad = [
        ([StepInput("a", [feed["a"]])], room + 1),
        ([StepInput("a", [feed["a"]], embeds)], 2),
        ([StepInput("a", [feed["a"]], capture_hidden=True)], 2),
        ([StepInput("a", [feed["a"]], sample=False)], 2),
        ([StepInput("a", [1, 2])], 2),
        ([StepInput("a", [1]), StepInput("a", [1])], 2),
    ]
    ledger = chained.token_ids("a")
    for inputs, length in bad:
        with pytest.raises(ValueError):
            chained.decode_chain(inputs, length)
    assert chained.token_ids("a") == ledger
    (result,) = chained.decode_chain([StepInput("a", [feed["a"]])], room)  # exactly fits
    assert len(result.tokens) == room and chained.num_free_rows("a") == 0


def test_hooked_rows_and_the_reference_path_cannot_chain(make_runner) -> None:
    reference = make_runner()
    reference.add_request("a", SamplingParams())
    assert reference.chain_lengths == ()
    with pytest.raises(ValueError, match="fast path"):
        reference.decode_chain([StepInput("a", [1])], 2)
    fast = make_runner(attention_backend="triton", decode_chain_lengths=(4, 8))
    assert fast.chain_lengths == (4, 8)
    fast.add_request("p", SamplingParams(repetition_penalty=1.3))
    with pytest.raises(ValueError, match="host"):
        fast.decode_chain([StepInput("p", [1])], 2)
    assert fast.num_tokens("p") == 0
    assert fast.decode_chain([], 4) == []
    with pytest.raises(ValueError, match="decode_chain_lengths"):
        make_runner(attention_backend="triton", decode_chain_lengths=(1, 8))
