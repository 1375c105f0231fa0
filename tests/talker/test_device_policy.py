"""The Talker engine with its chunk policy on the device against the host-hook policy, on CPU.

Strategy: the same conditions go to two engines over the same tiny Talker, one with the host
hook (`PolicyGuard`, logits rows sampled on the host) and one with the device policy (the
`TalkerPolicyTable` as the runner's logits processor); every streamed code, every KV ledger
and every request's penalty window must be identical. Sessions are staggered so batches mix
prefills and decodes; plans cross condition boundaries, a rollover (Talker context 256), new
turns (re-admission into another slot: the penalty window must follow), an empty handoff
and turn ends. The model favours a few codes, so codes repeat inside the 16-code window and
the penalty keeps steering the draws; an EOS bias makes turn starts and turn ends stop early. The
reference runner path is the fast one to run here; one shorter run goes through the fast
path (Triton interpreted, decode batches through the sampling-graph code run eagerly): two
staggered sessions on the interpreted tiny shape (test_talker_engine.INTERPRETED).
Semantics of the table against the host policy step by step: test_policy_table.py.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.contracts.messages import TalkerRequest
from backends.models.talker import TalkerConfig, TalkerModel
from backends.models.talker_policy import CODEC_EOS, TalkerChunkPolicy, TalkerSamplingConfig
from backends.runner.types import RunnerConfig
from backends.stages.talker_engine import TalkerEngine
from backends.talker.device_policy import DevicePolicy
from backends.talker.policy_guard import PolicyGuard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
from test_talker_engine import (  # noqa: E402
    BLOCK_SIZE,
    CONTEXT,
    EOS_UNWANTED,
    EOS_WANTED,
    INTERPRETED,
    LLM_DIM,
    EosBiasedTalker,
    codes_of,
    condition,
    run_until_idle,
    submit,
    tiny_config,
)

MAX_REQS = 4
FAVOURITES = 12  # codes 0..11 get a logit bonus: draws repeat inside the penalty window


class RepetitiveTalker(TalkerModel):
    """A tiny random Talker whose logits favour a few codes, EOS shifted by a constant."""

    def __init__(self, config: TalkerConfig, eos_bias: float) -> None:
        super().__init__(config)
        self.eos_bias = eos_bias

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> [n, num_audio_tokens] float32."""
        logits = super().compute_logits(hidden)
        logits[:, :FAVOURITES] += 2.5
        logits[:, CODEC_EOS] += self.eos_bias
        return logits


def build_model(eos_bias: float = 0.0, **shape: int) -> TalkerModel:
    """shape: tiny_config's (INTERPRETED for the fast path)."""
    torch.manual_seed(7)
    return RepetitiveTalker(tiny_config(**shape), eos_bias).eval()


def make_engine(model, device_policy: bool | None, penalty: float, backend: str = "reference"):
    config = RunnerConfig(
        num_blocks=MAX_REQS * CONTEXT // BLOCK_SIZE, max_num_reqs=MAX_REQS,
        max_model_len=CONTEXT, block_size=BLOCK_SIZE, attention_backend=backend,
        cuda_graph_sizes=(1, 2, 4),
    )  # fmt: skip
    sampling = TalkerSamplingConfig(repetition_penalty=penalty)
    return TalkerEngine(model, config, sampling, device_policy=device_policy)


def empty_turn_start(request_id: str, seq: int, seed: int) -> TalkerRequest:
    no_rows = np.zeros((0, LLM_DIM), np.float32)  # [0, llm_dim] float32
    return TalkerRequest(request_id, seq, np.zeros(0, np.int32), no_rows, turn_start=True,
                         seed=seed)  # fmt: skip


def long_plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """Turn 1: start, 5 mid-turn units, turn end (rolls over); an empty new turn; turn 2:
    start, 2 mid-turn units, one-unit turn end."""
    plan = [condition(request_id, 0, turn_start=True, seed=seed)]
    plan += [condition(request_id, seq, seed=seed) for seq in range(1, 6)]
    plan += [condition(request_id, 6, turn_end=True, seed=seed)]
    plan += [empty_turn_start(request_id, 7, seed)]
    plan += [condition(request_id, 8, turn_start=True, seed=seed)]
    plan += [condition(request_id, seq, seed=seed) for seq in (9, 10)]
    return plan + [condition(request_id, 11, turn_end=True, seed=seed)]


def short_plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """Early-EOS chunks only (with an EOS bias): turn start, new turn (re-admission), turn
    end; each chunk is a few decode steps."""
    return [
        condition(request_id, 0, turn_start=True, seed=seed),
        condition(request_id, 1, turn_start=True, seed=seed),
        condition(request_id, 2, turn_end=True, seed=seed),
    ]


def run_sessions(engine: TalkerEngine, plan, num_sessions: int) -> dict[str, list]:
    """Sessions start 3 steps apart; returns each one's codes per condition."""
    sinks = {}
    for i in range(num_sessions):
        request_id = f"s{i}"
        sinks[request_id] = [submit(engine, r) for r in plan(request_id, 100 + i)]
        for _ in range(3):
            engine.step()
    run_until_idle(engine)
    return {rid: [codes_of(sink).tolist() for sink in group] for rid, group in sinks.items()}


def window(engine: TalkerEngine, request_id: str) -> Counter[int]:
    """The request's penalty window, from whichever policy it has."""
    hook = engine._streams[request_id].hook
    if isinstance(hook, PolicyGuard):
        return Counter(hook.policy.recent_codes)
    slot = engine.runner.states.slot_of(request_id)
    return Counter(code for code in hook.table.table[slot, 8:].tolist() if code >= 0)


def assert_same_run(host: TalkerEngine, device: TalkerEngine, plan, num_sessions: int) -> dict:
    expected = run_sessions(host, plan, num_sessions)
    got = run_sessions(device, plan, num_sessions)
    assert got == expected
    for request_id in expected:
        assert device.runner.token_ids(request_id) == host.runner.token_ids(request_id)
        assert window(device, request_id) == window(host, request_id)
    return expected


@pytest.mark.parametrize("eos_bias,penalty", [(-9.0, 1.05), (2.0, 1.05), (2.0, 1.5), (3.0, 2.0)])
def test_device_policy_streams_the_host_policy_codes(eos_bias: float, penalty: float) -> None:
    model = build_model(eos_bias)
    host = make_engine(model, device_policy=False, penalty=penalty)
    device = make_engine(model, device_policy=True, penalty=penalty)
    codes = assert_same_run(host, device, long_plan, num_sessions=3)
    lengths = [len(chunk) for chunks in codes.values() for chunk in chunks]
    assert lengths.count(0) >= 3  # the empty handoffs
    if eos_bias > 0:
        assert any(0 < n < 25 for n in lengths)  # early EOS at a turn start or turn end
    else:
        assert 103 in lengths  # a turn end running to its forced EOS


@pytest.mark.parametrize(
    "eos_bias,expected",
    [(EOS_WANTED, [0, 25, 0]), (EOS_UNWANTED, [25, 25, 103])],
    ids=["eos-wanted", "eos-unwanted"],
)
def test_budgets_are_exact_on_the_device(eos_bias: float, expected: list[int]) -> None:
    """docs/architecture.md edge case 5 with the device policy: EOS masked until the 26th sample
    of a mid-turn chunk, forced there and at the turn end's 104th; early EOS where allowed."""
    torch.manual_seed(7)
    engine = make_engine(EosBiasedTalker(tiny_config(), eos_bias).eval(), True, 1.05)
    plan = [condition("r", 0, turn_start=True), condition("r", 1), condition("r", 2, turn_end=True)]
    sinks = [submit(engine, request) for request in plan]
    run_until_idle(engine)
    assert [len(codes_of(sink)) for sink in sinks] == expected


@pytest.mark.interpreter
def test_fast_path_device_policy_matches_its_host_hook() -> None:
    """Same fast-path forward on both sides (bitwise the same logits); only the policy and
    sampler differ: host hook + host draw against device table + device draw."""
    pytest.importorskip("triton")
    model = build_model(3.0, **INTERPRETED)
    host = make_engine(model, device_policy=False, penalty=1.5, backend="triton")
    device = make_engine(model, device_policy=None, penalty=1.5, backend="triton")
    codes = assert_same_run(host, device, short_plan, num_sessions=2)
    assert all(isinstance(device._streams[rid].hook, DevicePolicy) for rid in codes)
    assert device.runner.logits_processor is not None and host.runner.logits_processor is None


def test_policy_placement() -> None:
    """Auto: the device policy on the fast path, the host hook on the reference path, for a
    custom policy and for an unbounded penalty window."""
    model = build_model()
    assert make_engine(model, None, 1.05).runner.logits_processor is None
    config = make_engine(model, None, 1.05).runner.config
    unbounded = TalkerSamplingConfig(penalty_window=0)
    fast = RunnerConfig(**{**_fields(config), "attention_backend": "triton"})
    assert TalkerEngine(model, fast).runner.logits_processor is not None
    assert TalkerEngine(model, fast, unbounded).runner.logits_processor is None
    custom = TalkerEngine(model, fast, policy_factory=TalkerChunkPolicy)
    assert custom.runner.logits_processor is None
    with pytest.raises(ValueError, match="custom Talker policy_factory"):
        TalkerEngine(model, config, policy_factory=TalkerChunkPolicy, device_policy=True)


def _fields(config: RunnerConfig) -> dict:
    return {name: getattr(config, name) for name in RunnerConfig.__dataclass_fields__}


def test_the_penalty_changes_codes() -> None:
    """So the parity above is not vacuous: the device window does steer the draws."""
    model = build_model()
    with_penalty = run_sessions(make_engine(model, True, 2.0), long_plan, 1)
    without = run_sessions(make_engine(model, True, 1.0), long_plan, 1)
    assert with_penalty != without
