"""Tests for backends/stages/talker_engine.py: conditions in, streamed codec frames out.

Strategy: a tiny random-weight TalkerModel (2 layers, hidden 32, the real 6562-code vocabulary
so the real chunk policy applies) driven through the real ModelRunner. Budgets are checked on
models whose EOS logit is pushed far up (EOS wanted at every step) or far down (EOS only when
the policy forces it), so frame counts are exact and do not depend on what random weights
happen to sample. Determinism checks compare codes exactly (`np.array_equal`): sampling is a
pure function of (seed, position, logits), so batch composition must not change a code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.contracts.messages import ACTION_STOP, TalkerCodes, TalkerRequest
from backends.contracts.sink import ListSink
from backends.models.talker import TalkerConfig, TalkerModel
from backends.models.talker_policy import TalkerChunkPolicy, TalkerSamplingConfig
from backends.runner.types import RunnerConfig
from backends.stages.talker_engine import TalkerEngine
from backends.talker.rollover import CONDITION_PLACEHOLDER_ID

LLM_DIM = 16
CONTEXT = 256  # small Talker context so a handful of chunks forces a rollover
BLOCK_SIZE = 16
MAX_REQS = 4
EOS = 6561
# Added to the EOS logit: far above any random-weight logit (|logit| < ~10 here), so the
# sampler always picks EOS unless the policy masks it (and never picks it when negative).
EOS_WANTED = 1e4
EOS_UNWANTED = -1e4
STEP_LIMIT = 5000  # a run that needs more steps than this is stuck, not slow


class EosBiasedTalker(TalkerModel):
    """A TalkerModel whose EOS logit is shifted by a constant."""

    def __init__(self, config: TalkerConfig, eos_bias: float) -> None:
        super().__init__(config)
        self.eos_bias = eos_bias

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> [n, num_audio_tokens] float32 with EOS shifted."""
        logits = super().compute_logits(hidden)
        logits[:, EOS] += self.eos_bias
        return logits


# The tiny Talker of the engine tests that run the fast path in Triton's interpreter: its time
# grows with attention programs (heads) and kernel launches (layers), and what those tests check
# (policy, chains, admission) does not depend on either; the runner tests cover chains over
# several layers and heads (tests/runner/test_decode_chain.py).
INTERPRETED = {"num_heads": 1, "num_layers": 1}


def tiny_config(num_heads: int = 2, num_layers: int = 2) -> TalkerConfig:
    return TalkerConfig(
        llm_dim=LLM_DIM,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        num_hidden_layers=num_layers,
        max_position_embeddings=CONTEXT,
        num_text_tokens=64,
        audio_bos_token_id=60,
        text_eos_token_id=61,
    )


def build_model(eos_bias: float = 0.0, **shape: int) -> TalkerModel:
    """shape: tiny_config's (INTERPRETED for the fast path)."""
    torch.manual_seed(7)
    return EosBiasedTalker(tiny_config(**shape), eos_bias).eval()


@pytest.fixture(scope="module")
def plain_model() -> TalkerModel:
    return build_model()


@pytest.fixture(scope="module")
def eos_wanted_model() -> TalkerModel:
    return build_model(EOS_WANTED)


@pytest.fixture(scope="module")
def eos_unwanted_model() -> TalkerModel:
    return build_model(EOS_UNWANTED)


def make_engine(
    model: TalkerModel, max_num_reqs: int = MAX_REQS, **sampling: float
) -> TalkerEngine:
    blocks_per_request = CONTEXT // BLOCK_SIZE
    config = RunnerConfig(
        num_blocks=max_num_reqs * blocks_per_request,
        max_num_reqs=max_num_reqs,
        max_model_len=CONTEXT,
        block_size=BLOCK_SIZE,
    )
    return TalkerEngine(model, config, TalkerSamplingConfig(**sampling))


def condition(
    request_id: str,
    seq: int,
    num_tokens: int = 6,
    *,
    turn_start: bool = False,
    turn_end: bool = False,
    seed: int = 42,
) -> TalkerRequest:
    """A handoff whose content depends only on (seq, num_tokens), so reruns are identical."""
    rng = np.random.default_rng(1000 + seq)
    return TalkerRequest(
        request_id=request_id,
        condition_seq=seq,
        token_ids=rng.integers(0, 50, num_tokens).astype(np.int32),
        hidden=rng.standard_normal((num_tokens, LLM_DIM)).astype(np.float32),
        turn_start=turn_start,
        turn_end=turn_end,
        seed=seed,
    )


def run_until_idle(engine: TalkerEngine) -> int:
    for num_steps in range(STEP_LIMIT):
        if not engine.has_work():
            return num_steps
        engine.step()
    raise AssertionError(f"engine still busy after {STEP_LIMIT} steps")


def submit(engine: TalkerEngine, request: TalkerRequest) -> ListSink:
    sink = ListSink()
    engine.submit(request, sink)
    return sink


def groups(sink: ListSink) -> list[TalkerCodes]:
    return [result for result in sink.results if isinstance(result, TalkerCodes)]


def codes_of(sink: ListSink) -> np.ndarray:
    """[k] int32 every frame the sink received; asserts the chunk finished cleanly."""
    assert sink.closed and sink.error is None, sink.error
    received = groups(sink)
    assert [g.finished for g in received] == [False] * (len(received) - 1) + [True]
    return np.concatenate([g.codes for g in received])


def group_sizes(sink: ListSink) -> list[int]:
    return [len(g.codes) for g in groups(sink)]


# -- chunk budgets -------------------------------------------------------------------------


def test_mid_turn_chunk_is_exactly_25_frames_even_when_eos_is_wanted(
    eos_wanted_model: TalkerModel,
) -> None:
    """docs/architecture.md edge case 5: EOS is masked until the 26th sample, a forced EOS."""
    engine = make_engine(eos_wanted_model)
    start = submit(engine, condition("r", 0, turn_start=True))
    middle = submit(engine, condition("r", 1))
    run_until_idle(engine)
    assert group_sizes(start) == [0]  # turn start: early EOS allowed, here at once
    assert group_sizes(middle) == [25, 0]
    assert EOS not in codes_of(middle)


def test_turn_end_chunk_runs_to_103_frames_in_groups_of_25(
    eos_unwanted_model: TalkerModel,
) -> None:
    engine = make_engine(eos_unwanted_model)
    start = submit(engine, condition("r", 0, turn_start=True))
    end = submit(engine, condition("r", 1, turn_end=True))
    run_until_idle(engine)
    assert group_sizes(start) == [25, 0]  # turn start is capped at 26 samples too
    assert group_sizes(end) == [25, 25, 25, 25, 3]
    assert all(g.condition_seq == 1 and g.request_id == "r" for g in groups(end))


def test_turn_end_chunk_may_stop_at_once(eos_wanted_model: TalkerModel) -> None:
    engine = make_engine(eos_wanted_model)
    end = submit(engine, condition("r", 0, turn_start=True, turn_end=True))
    run_until_idle(engine)
    assert group_sizes(end) == [0]



def test_engine_caps_frames_even_if_the_policy_never_forces_eos(
    eos_unwanted_model: TalkerModel,
) -> None:
    """The budget bounds the KV reserve, so the engine enforces it on its own too: a policy
    that forgets the forced EOS must not let a chunk overrun its reserved context."""

    class LaxPolicy(TalkerChunkPolicy):
        def before_sample(self, logits: torch.Tensor, ctx: object) -> int | None:
            return None

    config = make_engine(eos_unwanted_model).runner.config
    engine = TalkerEngine(eos_unwanted_model, config, policy_factory=LaxPolicy)
    start = submit(engine, condition("r", 0, turn_start=True))
    end = submit(engine, condition("r", 1, turn_end=True))
    run_until_idle(engine)
    assert len(codes_of(start)) == 25 and len(codes_of(end)) == 103
    assert engine.runner.num_tokens("r") == 7 + 25 + 7 + 103

def test_frames_are_codec_ids_and_every_frame_is_forwarded(plain_model: TalkerModel) -> None:
    """The KV after a chunk holds the condition rows and every frame, but never the EOS."""
    engine = make_engine(plain_model)
    sink = submit(engine, condition("r", 0, num_tokens=6, turn_start=True))
    run_until_idle(engine)
    codes = codes_of(sink)
    assert codes.dtype == np.int32 and np.all((codes >= 0) & (codes < EOS))
    ledger = engine.runner.token_ids("r")
    assert ledger == [CONDITION_PLACEHOLDER_ID] * 7 + codes.tolist()


def test_empty_handoff_finishes_at_once_without_a_forward(plain_model: TalkerModel) -> None:
    engine = make_engine(plain_model)
    empty = TalkerRequest(
        "r", 0, np.zeros((0,), np.int32), np.zeros((0, LLM_DIM), np.float32), turn_start=True
    )
    sink = submit(engine, empty)
    run_until_idle(engine)
    assert group_sizes(sink) == [0] and groups(sink)[0].finished
    assert engine.runner.num_tokens("r") == 0


# -- condition sequence and prompt replacement ----------------------------------------------


@pytest.mark.parametrize("bad_seq", [2, 0], ids=["skipped", "stale"])
def test_non_consecutive_seq_ends_the_request(plain_model: TalkerModel, bad_seq: int) -> None:
    engine = make_engine(plain_model)
    baseline = engine.runner.num_free_blocks()
    first = submit(engine, condition("r", 0, turn_start=True))
    engine.step()
    bad = submit(engine, condition("r", bad_seq))
    assert bad.error is not None and bad.error.code == "invalid_argument"
    assert "condition_seq" in bad.error.message
    assert first.closed and first.error is not None  # the in-flight chunk ends with it
    assert engine.num_requests() == 0 and not engine.has_work()
    assert engine.runner.num_free_blocks() == baseline


def test_turn_start_replaces_the_prompt(plain_model: TalkerModel) -> None:
    """After a turn start the KV holds only the new turn: the same codes as a fresh request."""
    engine = make_engine(plain_model, repetition_penalty=1.0)
    baseline = engine.runner.num_free_blocks()
    for seq in range(3):
        submit(engine, condition("r", seq, turn_start=seq == 0))
    run_until_idle(engine)
    grown = engine.runner.num_tokens("r")
    new_turn = submit(engine, condition("r", 3, turn_start=True))
    run_until_idle(engine)
    codes = codes_of(new_turn)
    assert engine.runner.token_ids("r") == [CONDITION_PLACEHOLDER_ID] * 7 + codes.tolist()
    assert engine.runner.num_tokens("r") < grown
    assert engine.runner.num_free_blocks() == baseline - CONTEXT // BLOCK_SIZE

    fresh = make_engine(plain_model, repetition_penalty=1.0)
    alone = submit(fresh, condition("other", 3, turn_start=True))
    run_until_idle(fresh)
    assert np.array_equal(codes_of(alone), codes)


def test_rollover_keeps_producing_frames(eos_unwanted_model: TalkerModel) -> None:
    """docs/model_facts.md#talker-context-and-rollover: when condition + reserve no longer fit,
    the prompt is rebuilt as [previous condition] + [previous codes] + [current condition] and KV
    starts from zero."""
    engine = make_engine(eos_unwanted_model)
    rows = 21  # 20 handed tokens + audio_bos: 46 tokens per chunk, a rollover every ~4 chunks
    previous_codes: list[int] = []
    num_rollovers = 0
    for seq in range(12):
        before = engine.runner.num_tokens("r") if seq else 0
        sink = submit(engine, condition("r", seq, num_tokens=rows - 1, turn_start=seq == 0))
        run_until_idle(engine)
        codes = codes_of(sink).tolist()
        assert len(codes) == 25 and {g.condition_seq for g in groups(sink)} == {seq}
        after = engine.runner.num_tokens("r")
        assert after <= CONTEXT
        if seq and after < before:
            num_rollovers += 1
            placeholders = [CONDITION_PLACEHOLDER_ID] * rows
            expected = placeholders + previous_codes + placeholders + codes
            assert engine.runner.token_ids("r") == expected
        previous_codes = codes
    assert num_rollovers >= 2


def test_condition_longer_than_the_context_is_refused(plain_model: TalkerModel) -> None:
    engine = make_engine(plain_model)
    sink = submit(engine, condition("r", 0, num_tokens=CONTEXT, turn_start=True))
    run_until_idle(engine)
    assert sink.error is not None and sink.error.code == "context_length_exceeded"
    assert engine.num_requests() == 0


# -- batching, stop and failures -------------------------------------------------------------


def session_plan(request_id: str, seed: int) -> list[TalkerRequest]:
    """A turn that crosses a rollover: start, five mid-turn units, then the turn end (its
    104-sample reserve no longer fits after ~6 chunks of 32 tokens in a 256 context)."""
    plan = [condition(request_id, 0, turn_start=True, seed=seed)]
    plan += [condition(request_id, seq, seed=seed) for seq in range(1, 6)]
    return plan + [condition(request_id, 6, turn_end=True, seed=seed)]


def run_alone(model: TalkerModel, request_id: str, seed: int) -> list[np.ndarray]:
    engine = make_engine(model)
    sinks = [submit(engine, request) for request in session_plan(request_id, seed)]
    run_until_idle(engine)
    return [codes_of(sink) for sink in sinks]


def test_batched_requests_give_the_same_codes_as_alone(plain_model: TalkerModel) -> None:
    """Seeded per request: mixed prefill/decode batches of 4 must not change any code. The
    requests start 3 steps apart, so prefills of some meet decodes of others."""
    seeds = {f"s{i}": 100 + i for i in range(4)}
    engine = make_engine(plain_model)
    sinks: dict[str, list[ListSink]] = {}
    for request_id, seed in seeds.items():
        sinks[request_id] = [submit(engine, r) for r in session_plan(request_id, seed)]
        for _ in range(3):
            engine.step()
    run_until_idle(engine)
    firsts = []
    for request_id, seed in seeds.items():
        batched = [codes_of(sink) for sink in sinks[request_id]]
        alone = run_alone(plain_model, request_id, seed)
        assert all(np.array_equal(b, a) for b, a in zip(batched, alone)), request_id
        # The turn end rolled over: KV = previous condition + its codes + turn-end chunk.
        expected_tokens = 7 + len(batched[-2]) + 7 + len(batched[-1])
        assert engine.runner.num_tokens(request_id) == expected_tokens
        firsts.append(batched[0])
    assert not np.array_equal(firsts[0], firsts[1])  # the seeds do reach the sampler


def test_stop_frees_everything_and_touches_no_other_request(plain_model: TalkerModel) -> None:
    engine = make_engine(plain_model)
    baseline = engine.runner.num_free_blocks()
    stopped = [submit(engine, condition("a", seq, turn_start=seq == 0)) for seq in range(2)]
    kept = submit(engine, condition("b", 0, turn_start=True, seed=5))
    for _ in range(5):
        engine.step()
    engine.stop("a")
    assert all(s.closed and s.error is not None and s.error.code == "cancelled" for s in stopped)
    engine.stop("a")  # idempotent
    engine.stop("never-submitted")
    assert engine.num_requests() == 1 and not kept.closed
    run_until_idle(engine)
    alone = codes_alone(plain_model, condition("b", 0, turn_start=True, seed=5))
    assert np.array_equal(codes_of(kept), alone)
    engine.stop("b")
    assert engine.runner.num_free_blocks() == baseline and engine.num_requests() == 0


def codes_alone(model: TalkerModel, request: TalkerRequest) -> np.ndarray:
    engine = make_engine(model)
    sink = submit(engine, request)
    run_until_idle(engine)
    return codes_of(sink)


def test_late_condition_after_stop_is_refused(plain_model: TalkerModel) -> None:
    """docs/architecture.md edge case 7: a stopped request never produces audio again, but a
    reused request id restarting at condition_seq 0 is a new request."""
    engine = make_engine(plain_model)
    submit(engine, condition("a", 0, turn_start=True))
    engine.step()
    no_rows = np.zeros((0, LLM_DIM), np.float32)  # [0, llm_dim] float32
    stop = TalkerRequest("a", 0, np.zeros(0, np.int32), no_rows, action=ACTION_STOP)
    stop_sink = submit(engine, stop)
    assert stop_sink.closed and stop_sink.error is None and engine.num_requests() == 0
    late = submit(engine, condition("a", 1))
    assert late.error is not None and late.error.code == "cancelled"
    assert not engine.has_work()
    restarted = submit(engine, condition("a", 0, turn_start=True))
    run_until_idle(engine)
    assert len(codes_of(restarted)) <= 25


class BrokenSink(ListSink):
    """A sink whose transport fails on the first send (a vanished client)."""

    def send(self, result: object) -> None:
        raise ConnectionError("client went away")


def test_exception_in_one_request_fails_only_that_request(plain_model: TalkerModel) -> None:
    engine = make_engine(plain_model)
    baseline = engine.runner.num_free_blocks()
    broken = BrokenSink()
    engine.submit(condition("a", 0, turn_start=True, turn_end=True), broken)
    queued = submit(engine, condition("a", 1))
    healthy = submit(engine, condition("b", 0, turn_start=True, seed=5))
    run_until_idle(engine)
    assert broken.error is not None and broken.error.code == "internal"
    assert "client went away" in broken.error.message
    assert queued.error is not None and queued.error.code == "internal"
    alone = codes_alone(plain_model, condition("b", 0, turn_start=True, seed=5))
    assert np.array_equal(codes_of(healthy), alone)
    engine.stop("b")
    assert engine.runner.num_free_blocks() == baseline


def test_failed_projection_fails_only_the_waiting_requests(
    plain_model: TalkerModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conditions get their rows in one batched pass at the next step; if that pass fails,
    the requests waiting on it fail, a request already generating goes on, and the engine
    projects later conditions again."""
    engine = make_engine(plain_model)
    baseline = engine.runner.num_free_blocks()
    running = submit(engine, condition("a", 0, turn_start=True, seed=5))
    engine.step()  # "a" projected and prefilled
    waiting = submit(engine, condition("b", 0, turn_start=True))

    def broken(*args: object) -> None:
        raise RuntimeError("projection bug")

    monkeypatch.setattr(plain_model, "condition_embeds_many", broken)
    engine.step()
    assert waiting.error is not None and waiting.error.code == "internal"
    assert "projection bug" in waiting.error.message
    monkeypatch.undo()
    later = submit(engine, condition("c", 0, turn_start=True, seed=7))
    run_until_idle(engine)
    alone = codes_alone(plain_model, condition("a", 0, turn_start=True, seed=5))
    assert np.array_equal(codes_of(running), alone)
    later_alone = codes_alone(plain_model, condition("c", 0, turn_start=True, seed=7))
    assert np.array_equal(codes_of(later), later_alone)
    for rid in ("a", "c"):
        engine.stop(rid)
    assert engine.runner.num_free_blocks() == baseline


def test_policy_exception_fails_only_its_request(plain_model: TalkerModel) -> None:
    """The policy runs inside the shared runner step; its failure must not abort the batch."""

    class ExplodingPolicy(TalkerChunkPolicy):
        def after_sample(self, token: int, ctx: object) -> int:
            if ctx.request_id == "a" and self.step == 3:  # type: ignore[attr-defined]
                raise ZeroDivisionError("policy bug")
            return super().after_sample(token, ctx)  # type: ignore[arg-type]

    config = make_engine(plain_model).runner.config
    engine = TalkerEngine(plain_model, config, policy_factory=ExplodingPolicy)
    failing = submit(engine, condition("a", 0, turn_start=True))
    healthy = submit(engine, condition("b", 0, turn_start=True, seed=5))
    run_until_idle(engine)
    assert failing.error is not None and failing.error.code == "internal"
    assert "policy bug" in failing.error.message
    alone = codes_alone(plain_model, condition("b", 0, turn_start=True, seed=5))
    assert np.array_equal(codes_of(healthy), alone)


def test_failed_kv_reservation_is_resource_exhausted(plain_model: TalkerModel) -> None:
    """docs/architecture.md edge case 10: no silent preemption; a request that cannot reserve its
    whole context is refused, and the admitted one runs on."""
    engine = make_engine(plain_model, max_num_reqs=1)
    admitted = submit(engine, condition("a", 0, turn_start=True))
    refused = submit(engine, condition("b", 0, turn_start=True))
    assert refused.error is not None and refused.error.code == "resource_exhausted"
    run_until_idle(engine)
    assert len(codes_of(admitted)) <= 25


def test_malformed_hidden_is_invalid_argument(plain_model: TalkerModel) -> None:
    engine = make_engine(plain_model)
    good = condition("a", 0, turn_start=True)
    bad = TalkerRequest("a", 0, good.token_ids, good.hidden[:, :-1], turn_start=True)
    sink = submit(engine, bad)
    assert sink.error is not None and sink.error.code == "invalid_argument"
    assert engine.num_requests() == 0
