"""The Talker engine with decode chains against the same engine stepping one frame at a time.

Strategy: two fast-path engines (Triton interpreted on CPU, device chunk policy) over the same
tiny Talker (one head, one layer: test_talker_engine.INTERPRETED), one with chains (lengths 4
and 8) and one without, get the same staggered plans: turn starts, mid-turn units, turn ends
(103 frames in groups of 25) and new turns, with EOS unwanted (every budget runs out inside a
chain) or favoured (early EOS mid-chain: the chain's tail is dropped). Every group each sink
receives (codes, finished flags), every KV ledger and every penalty window must be identical,
and chains must really have run. Then: a request stopped between chains, or stopped by its own
sink mid-chain, or failing mid-chain, ends alone, leaves the others' codes as they would be
without it, and leaks no slot or block.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton")

from test_device_policy import MAX_REQS, build_model, window  # noqa: E402

from backends.contracts.messages import TalkerCodes, TalkerRequest  # noqa: E402
from backends.contracts.sink import ListSink  # noqa: E402
from backends.models.talker import TalkerModel  # noqa: E402
from backends.runner.types import RunnerConfig  # noqa: E402
from backends.stages.talker_engine import TalkerEngine  # noqa: E402
from backends.talker.chain_plan import DEFAULT_CHAIN_LENGTHS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
from test_talker_engine import (  # noqa: E402
    BLOCK_SIZE,
    CONTEXT,
    INTERPRETED,
    codes_of,
    condition,
    run_until_idle,
    submit,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CHAINS = (4, 8)


def fast_model(eos_bias: float) -> TalkerModel:
    return build_model(eos_bias, **INTERPRETED)


def make_engine(model: TalkerModel, chains: tuple[int, ...] | None,
                sizes: tuple[int, ...] = (1, 2, 4)) -> TalkerEngine:
    config = RunnerConfig(
        num_blocks=MAX_REQS * CONTEXT // BLOCK_SIZE, max_num_reqs=MAX_REQS,
        max_model_len=CONTEXT, block_size=BLOCK_SIZE, attention_backend="triton",
        cuda_graph_sizes=sizes,
    )  # fmt: skip
    return TalkerEngine(model, config, chain_lengths=chains)


def plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """A turn start, a mid-turn unit, a turn end, then a new one-unit turn."""
    return [
        condition(request_id, 0, turn_start=True, seed=seed),
        condition(request_id, 1, seed=seed),
        condition(request_id, 2, turn_end=True, seed=seed),
        condition(request_id, 3, turn_start=True, turn_end=True, seed=seed),
    ]


def short_plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """A turn start, then a turn end (with EOS unwanted: 25 + 103 frames)."""
    return [
        condition(request_id, 0, turn_start=True, seed=seed),
        condition(request_id, 1, turn_end=True, seed=seed),
    ]


def turn_end_plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """A one-unit turn (with EOS unwanted: 103 frames in groups of 25)."""
    return [condition(request_id, 0, turn_start=True, turn_end=True, seed=seed)]


def received(sink: ListSink) -> list[tuple[list[int], bool]]:
    assert sink.closed and sink.error is None, sink.error
    return [(g.codes.tolist(), g.finished) for g in sink.results if isinstance(g, TalkerCodes)]


class ChainCounter:
    """Wraps a runner's decode_chain to count the chains and their lengths."""

    def __init__(self, engine: TalkerEngine) -> None:
        self.lengths: list[int] = []
        self.rows: list[int] = []
        self._chain = engine.runner.decode_chain
        engine.runner.decode_chain = self  # type: ignore[method-assign]

    def __call__(self, inputs, length):
        self.lengths.append(length)
        self.rows.append(len(inputs))
        return self._chain(inputs, length)


def run_staggered(engine: TalkerEngine, plan_of, num_sessions: int) -> dict[str, list]:
    sinks = {}
    for i in range(num_sessions):
        sinks[f"s{i}"] = [submit(engine, r) for r in plan_of(f"s{i}", 100 + i)]
        for _ in range(5):
            engine.step()
    run_until_idle(engine)
    return {rid: [received(sink) for sink in group] for rid, group in sinks.items()}


def assert_no_leak(engine: TalkerEngine) -> None:
    for request_id in list(engine._streams):
        engine.stop(request_id)
    counts = engine.resource_counts()
    assert counts["runner_requests"] == 0 and counts["kv_free_blocks"] == counts["kv_blocks"]


# EOS bias 3.0 on the tiny Talker: chunks of 0 to 19 frames end early (at the chain's first
# step, mid-chain, after several chains) next to the mid-turn unit's forced 25.
@pytest.mark.parametrize(
    "eos_bias,plan_of", [(-9.0, turn_end_plan), (3.0, plan)], ids=["budgets", "early-eos"]
)
@pytest.mark.interpreter
def test_chains_stream_the_single_step_groups(eos_bias: float, plan_of) -> None:
    num_sessions = 1 if eos_bias < 0 else 2  # one 103-frame turn is slow enough interpreted
    model = fast_model(eos_bias)
    stepped, chained = make_engine(model, ()), make_engine(model, CHAINS)
    assert stepped.runner.chain_lengths == () and chained.runner.chain_lengths == CHAINS
    counter = ChainCounter(chained)
    expected = run_staggered(stepped, plan_of, num_sessions)
    assert run_staggered(chained, plan_of, num_sessions) == expected
    for request_id in expected:
        assert chained.runner.token_ids(request_id) == stepped.runner.token_ids(request_id)
        assert window(chained, request_id) == window(stepped, request_id)
    assert 8 in counter.lengths and set(counter.lengths) <= set(CHAINS), counter.lengths
    lengths = [sum(len(codes) for codes, _ in chunk) for g in expected.values() for chunk in g]
    if eos_bias < 0:
        assert lengths == [103] and 4 in counter.lengths
        assert [len(codes) for codes, _ in expected["s0"][0]] == [25, 25, 25, 25, 3]
    else:
        assert any(0 < n < 25 for n in lengths)
    assert_no_leak(chained)


@pytest.mark.interpreter
def test_a_chain_takes_more_rows_than_the_configured_buckets() -> None:
    """With chains on, the decode buckets grow to every request: more sessions speaking at once
    than the largest configured bucket (32 by default) used to fail every chain."""
    model = fast_model(3.0)
    stepped, chained = make_engine(model, ()), make_engine(model, CHAINS, sizes=(1,))
    assert chained.runner.fast_path.graphs.sizes == (1, 2, 4)  # configured (1,), MAX_REQS 4
    counter = ChainCounter(chained)
    assert run_staggered(chained, plan, 2) == run_staggered(stepped, plan, 2)
    assert max(counter.rows) == 2, counter.rows
    assert_no_leak(chained)


def test_chains_are_on_by_default_with_the_device_policy_only() -> None:
    model = fast_model(-9.0)
    config = make_engine(model, None).runner.config
    assert config.decode_chain_lengths == DEFAULT_CHAIN_LENGTHS == (12,)
    host = TalkerEngine(model, config, device_policy=False)
    assert host.runner.chain_lengths == ()
    off = TalkerEngine(model, dataclasses.replace(config, decode_chain_lengths=()))
    assert off.runner.chain_lengths == ()


@pytest.fixture(scope="module")
def other_alone() -> list:
    """The codes of request "o" (seed 2, one turn start) run alone, EOS unwanted."""
    engine = make_engine(fast_model(-9.0), CHAINS)
    sinks = [submit(engine, r) for r in short_plan("o", 2)[:1]]
    run_until_idle(engine)
    return [codes_of(sink).tolist() for sink in sinks]


@pytest.mark.interpreter
def test_stop_between_chains_ends_only_that_request(other_alone: list) -> None:
    model = fast_model(-9.0)
    engine = make_engine(model, CHAINS)
    victim = [submit(engine, r) for r in short_plan("v", 1)]
    other = [submit(engine, r) for r in short_plan("o", 2)[:1]]
    for _ in range(3):  # prefill, then chains: the victim's first chunk is mid-way
        engine.step()
    assert 0 < len(engine._streams["v"].active.codes) < 25
    engine.stop("v")
    assert all(sink.closed and sink.error.code == "cancelled" for sink in victim)
    run_until_idle(engine)
    assert [codes_of(sink).tolist() for sink in other] == other_alone
    assert_no_leak(engine)


class StoppingSink(ListSink):
    """Stops its own request when it receives its first group (a consumer hanging up)."""

    def __init__(self, engine: TalkerEngine, request_id: str) -> None:
        super().__init__()
        self.engine, self.request_id = engine, request_id

    def send(self, result) -> None:
        super().send(result)
        self.engine.stop(self.request_id)


@pytest.mark.parametrize("how", ["sink-stop", "fault"])
@pytest.mark.interpreter
def test_a_request_ending_mid_chain_ends_alone(how: str, other_alone: list) -> None:
    model = fast_model(-9.0)
    engine = make_engine(model, CHAINS)
    if how == "sink-stop":
        sink = StoppingSink(engine, "v")
        engine.submit(short_plan("v", 1)[1], sink)  # a turn end: 1st group comes mid-chain
    else:
        sink = submit(engine, short_plan("v", 1)[1])
        calls = iter(range(1000))
        engine.fault_hook = lambda rid: rid == "v" and next(calls) == 11 and 1 / 0
    other = [submit(engine, r) for r in short_plan("o", 2)[:1]]
    run_until_idle(engine)
    expected_error = "cancelled" if how == "sink-stop" else "internal"
    assert sink.closed and sink.error.code == expected_error
    assert [codes_of(s).tolist() for s in other] == other_alone
    assert engine.num_requests() == 1  # the other's stream lives on, idle
    assert_no_leak(engine)
    assert np.all(np.asarray(engine.runner.states.chain_tail_np) == 0)
