"""The Talker engine admits many requests at once without extra runner forwards.

Strategy: B mid-turn conditions submitted together (what `perf/bench_audio_tail.py` times)
must cost the same runner forwards as one condition alone (one batched prefill, then the
decode steps or chains), and give every request the codes it gets alone. Forwards are counted
by wrapping the runner's two entry points. Run on the reference path (host hook, single steps)
with 16 requests, and on the fast path (Triton interpreted, device policy, chains) with 2:
each request also runs alone, and every interpreted run is a whole chunk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from backends.models.talker import TalkerModel
from backends.runner.types import RunnerConfig
from backends.stages.talker_engine import TalkerEngine
from test_talker_engine import (
    BLOCK_SIZE,
    CONTEXT,
    INTERPRETED,
    build_model,
    codes_of,
    condition,
    make_engine,
    run_until_idle,
    submit,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FRAMES = 25  # a mid-turn chunk with EOS unwanted: exactly 25 frames, then the forced EOS


def count_forwards(engine: TalkerEngine) -> Counter[str]:
    calls: Counter[str] = Counter()
    runner = engine.runner
    for name in ("launch_step", "launch_chain"):
        inner = getattr(runner, name)

        def wrapped(*args: object, _inner: Callable = inner, _name: str = name) -> object:
            calls[_name] += 1
            return _inner(*args)

        setattr(runner, name, wrapped)
    return calls


def run_together(engine: TalkerEngine, ids: list[str]) -> tuple[list[np.ndarray], Counter[str]]:
    """Submit one mid-turn condition per id, then step until idle: (codes, forwards)."""
    calls = count_forwards(engine)
    sinks = [submit(engine, condition(rid, 0, seed=100 + i)) for i, rid in enumerate(ids)]
    run_until_idle(engine)
    for rid in ids:
        engine.stop(rid)
    return [codes_of(sink) for sink in sinks], calls


def check_batch_like_alone(make: Callable[[int], TalkerEngine], batch: int) -> Counter[str]:
    ids = [f"b{i}" for i in range(batch)]
    together, calls = run_together(make(batch), ids)
    for i, rid in enumerate(ids):
        engine = make(1)  # the same condition and seed as in the batch, in a fresh engine
        alone_calls = count_forwards(engine)
        alone = submit(engine, condition(rid, 0, seed=100 + i))
        run_until_idle(engine)
        assert np.array_equal(codes_of(alone), together[i]), rid
        assert len(together[i]) == FRAMES
        assert calls == alone_calls, (calls, alone_calls)  # no forward per request
    return calls


@pytest.fixture(scope="module")
def eos_unwanted_model() -> TalkerModel:
    return build_model(-1e4)


def test_sixteen_requests_admitted_together_cost_one_prefill(
    eos_unwanted_model: TalkerModel,
) -> None:
    calls = check_batch_like_alone(lambda n: make_engine(eos_unwanted_model, max_num_reqs=n), 16)
    assert calls == {"launch_step": FRAMES + 1}  # 1 prefill + 25 decode steps (EOS forced)


@pytest.mark.interpreter
def test_chained_requests_admitted_together_cost_one_prefill_and_the_chains() -> None:
    pytest.importorskip("triton")
    model = build_model(-1e4, **INTERPRETED)

    def make(n: int) -> TalkerEngine:
        config = RunnerConfig(
            num_blocks=n * CONTEXT // BLOCK_SIZE, max_num_reqs=n, max_model_len=CONTEXT,
            block_size=BLOCK_SIZE, attention_backend="triton", cuda_graph_sizes=(1, 2, 4),
        )  # fmt: skip
        return TalkerEngine(model, config)

    calls = check_batch_like_alone(make, 2)
    # 1 prefill + chains of 12 + 12 (the default length), then the forced EOS as one step
    assert calls == {"launch_step": 2, "launch_chain": 2}
