"""Decode chains on a GPU: graphed chains equal eager chains and single steps, with no sync.

Strategy (skipped without CUDA): bf16 fast-path runners over the same tiny random Qwen3, one
with chain graphs captured (lengths 4 and 8 for every decode bucket) and one running the same
chain ops eagerly, get the same prompts and then chains of each length over 5 requests
(bucket 8, 3 padding rows) with greedy and seeded filtered sampling: tokens and KV must be
identical. A graphed chain must also draw what graphed single decode steps draw (same
kernels, same bucket), and must queue all its work without one host-device sync (torch's sync
debug mode set to "error" around `launch_chain`; the one wait comes after).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402
from no_sync import launch_chain_without_host_sync  # noqa: E402

from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import SamplingParams, StepInput  # noqa: E402

pytestmark = pytest.mark.gpu
LENGTHS = (4, 8)
PROMPTS = {f"r{i}": list(range(3 + i, 20 + 3 * i)) for i in range(5)}


def params(i: int) -> SamplingParams:
    if i % 2 == 0:
        return SamplingParams()
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i)


def prefilled(model, **overrides: object) -> tuple[ModelRunner, dict[str, int]]:
    runner = runner_for(model, decode_chain_lengths=LENGTHS, **overrides)
    for i, rid in enumerate(PROMPTS):
        runner.add_request(rid, params(i))
    results = runner.step([StepInput(rid, ids) for rid, ids in PROMPTS.items()])
    return runner, {r.request_id: r.token for r in results}


def kv_rows(runner: ModelRunner, request_id: str) -> torch.Tensor:
    blocks = torch.tensor(runner.block_ids(request_id), device=runner.kv.data.device)
    data = runner.kv.data[:, :, blocks].flatten(2, 3)
    return data[:, :, : runner.num_tokens(request_id)]


def chain_all(runner: ModelRunner, feed: dict[str, int], length: int) -> dict[str, list[int]]:
    results = runner.decode_chain([StepInput(rid, [t]) for rid, t in feed.items()], length)
    return {r.request_id: r.tokens for r in results}


def test_graphed_chains_equal_eager_chains(make_gpu_model) -> None:
    model = make_gpu_model(torch.bfloat16)
    graphed, feed_g = prefilled(model)
    eager, feed_e = prefilled(model, use_cuda_graphs=False)
    sizes = graphed.fast_path.graphs.sizes  # type: ignore[union-attr]
    assert graphed.chains.num_captured == len(sizes) * len(LENGTHS)  # type: ignore[union-attr]
    assert eager.chains.num_captured == 0  # type: ignore[union-attr]
    assert feed_g == feed_e
    for length in (8, 4, 8):
        got, want = chain_all(graphed, feed_g, length), chain_all(eager, feed_e, length)
        assert got == want
        feed_g = feed_e = {rid: tokens[-1] for rid, tokens in got.items()}
    for rid in PROMPTS:
        assert graphed.token_ids(rid) == eager.token_ids(rid)
        assert torch.equal(kv_rows(graphed, rid), kv_rows(eager, rid))


def test_graphed_chain_draws_the_single_steps_tokens(make_gpu_model) -> None:
    model = make_gpu_model(torch.bfloat16)
    chained, feed = prefilled(model)
    stepped, _ = prefilled(model)
    got = chain_all(chained, feed, 8)
    want: dict[str, list[int]] = {rid: [] for rid in feed}
    for _ in range(8):
        results = stepped.step([StepInput(rid, [t]) for rid, t in feed.items()])
        feed = {r.request_id: r.token for r in results}
        for rid, token in feed.items():
            want[rid].append(token)
    assert got == want
    for rid in PROMPTS:
        assert chained.token_ids(rid) == stepped.token_ids(rid)


def test_graphed_chain_has_no_host_sync(make_gpu_model) -> None:
    runner, feed = prefilled(make_gpu_model(torch.bfloat16))
    feed = {rid: tokens[-1] for rid, tokens in chain_all(runner, feed, 8).items()}  # warm
    inputs = [StepInput(rid, [t]) for rid, t in feed.items()]
    pending = launch_chain_without_host_sync(runner, inputs, 8)
    results = pending.wait()  # the chain's one wait, outside the check
    assert [len(r.tokens) for r in results] == [8] * len(inputs)
