"""The runner's CUDA fast path on a GPU: kernels, parity with the CPU reference, graphs, syncs.

Strategy: the CPU reference path (float32, plain torch) is the oracle. The fast path must give
the same greedy tokens and hidden states within float32 tolerance when run in float32, and
within bf16 tolerance in bf16; a graphed decode must equal the same step run eagerly through
the same kernels bit for bit; a graphed decode step must queue all its work without one
host-device sync (torch's sync debug mode set to "error" around `launch_step`; the output wait
comes after). Skipped without CUDA.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402
from no_sync import launch_without_host_sync  # noqa: E402

from backends.runner.attention import AttentionMetadata, paged_attention_reference  # noqa: E402
from backends.runner.device_sampler import uniform_noise  # noqa: E402
from backends.runner.triton_paged_attention import paged_attention_triton  # noqa: E402
from backends.runner.types import SamplingParams, StepInput  # noqa: E402

# Relative L2 error bounds against a float32 reference on the same (rounded) inputs:
# float32 with TF32 dots in the attention kernel lands near 3e-4; bf16 operands near 1e-2.
FP32_REL = 3e-3
BF16_REL = 3e-2


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).norm() / ref.norm())


def paged_case(dtype: torch.dtype, context: list[int], queries: list[int]):
    """Random K/V in a shuffled page pool on the GPU, page size 16, 8 heads over 2 kv heads."""
    gen = torch.Generator().manual_seed(7)
    page, heads, kv_heads, dim = 16, 8, 2, 64
    seq = [c + q for c, q in zip(context, queries)]
    pages = [-(-s // page) for s in seq]
    order = torch.randperm(sum(pages) + 4, generator=gen).tolist()
    tables = torch.full((len(seq), max(pages)), -1, dtype=torch.int32)
    for i, n in enumerate(pages):
        tables[i, :n] = torch.tensor([order.pop() for _ in range(n)])
    cache = torch.randn(2, sum(pages) + 4, page, kv_heads, dim, generator=gen).to(dtype)
    cu = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(cu).cuda(),
        seq_lens=torch.tensor(seq, dtype=torch.int32).cuda(),
        context_lens=torch.tensor(context, dtype=torch.int32).cuda(),
        block_tables=tables.cuda(),
        slot_mapping=torch.zeros(int(cu[-1]), dtype=torch.int64).cuda(),
        query_start_loc_np=cu,
        seq_lens_np=np.asarray(seq, dtype=np.int32),
        block_size=page,
        backend="triton",
    )
    query = torch.randn(int(cu[-1]), heads, dim, generator=gen).to(dtype).cuda()
    return query, cache[0].cuda(), cache[1].cuda(), meta


@pytest.mark.parametrize("dtype,bound", [(torch.bfloat16, BF16_REL), (torch.float32, FP32_REL)])
@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("tile", [None, 128])
def test_paged_attention_kernel(dtype: torch.dtype, bound: float, splits: int | None,
                                tile: int | None) -> None:  # fmt: skip
    query, k_cache, v_cache, meta = paged_case(dtype, [0, 700, 33, 2000], [5, 1, 13, 1])
    out = paged_attention_triton(query, k_cache, v_cache, meta, 0.125, splits=splits, tile=tile)
    ref_meta = dataclasses.replace(meta, backend="reference")
    ref = paged_attention_reference(
        query.float(), k_cache.float(), v_cache.float(), ref_meta, 0.125
    )
    assert rel_error(out, ref) < bound


def drive(runner, steps: int, prompts: dict[str, list[int]], forced=None):
    """Prefill every prompt in one mixed step, then `steps` decode batches of all requests,
    each fed its last token, or the token of `forced` (another drive's results) when given."""
    for rid in prompts:
        runner.add_request(rid, SamplingParams())
    results = [runner.step([StepInput(r, ids, capture_hidden=True) for r, ids in prompts.items()])]
    for step in range(steps):
        source = forced[step] if forced is not None else results[-1]
        feed = [StepInput(r.request_id, [r.token], capture_hidden=True) for r in source]
        results.append(runner.step(feed))
    return results


PROMPTS = {"a": list(range(1, 40)), "b": [5, 9, 11], "c": list(range(100, 117))}


@pytest.mark.parametrize("dtype,bound", [(torch.float32, FP32_REL), (torch.bfloat16, BF16_REL)])
def test_fast_path_matches_cpu_reference(cpu_model, make_gpu_model, dtype, bound) -> None:
    expected = drive(runner_for(cpu_model), 6, PROMPTS)
    got = drive(runner_for(make_gpu_model(dtype)), 6, PROMPTS, forced=expected)
    gpu_head = make_gpu_model(dtype)
    for step_ref, step_got in zip(expected, got):
        for ref, res in zip(step_ref, step_got):
            assert res.positions == ref.positions
            assert rel_error(res.hidden, ref.hidden) < bound
            logits_ref = cpu_model.compute_logits(ref.hidden)
            logits = gpu_head.compute_logits(res.hidden.to(device="cuda", dtype=dtype))
            assert rel_error(logits, logits_ref) < bound
    if dtype == torch.float32:  # bf16 may flip a near-tie; float32 must not
        assert [[r.token for r in s] for s in got] == [[r.token for r in s] for s in expected]


@pytest.mark.parametrize("keep,drop", [(16, 37), (0, 5), (32, 16), (21, 7), (21, 40)])
def test_reanchor_on_the_fast_path_matches_cpu_reference(cpu_model, make_gpu_model, keep, drop) -> None:
    """A cut on the CUDA KV pages (whole pages out of the chain, the remainder moved inside the
    pages, keys re-rotated; the prefix may end inside a page) leaves the same cache as on the CPU
    reference path."""
    def cut_then_append(runner):
        runner.add_request("r", SamplingParams())
        runner.step([StepInput("r", list(range(1, 80)), sample=False)])
        runner.reanchor("r", keep_prefix=keep, drop=drop)
        return runner.step([StepInput("r", [7, 8, 9], capture_hidden=True)])[0]

    ref = cut_then_append(runner_for(cpu_model))
    got = cut_then_append(runner_for(make_gpu_model(torch.float32)))
    assert got.positions == ref.positions == list(range(79 - drop, 82 - drop))
    assert rel_error(got.hidden, ref.hidden) < FP32_REL


def test_graph_replay_equals_eager(make_gpu_model) -> None:
    model = make_gpu_model(torch.bfloat16)
    graphed = runner_for(model)
    eager = runner_for(model, use_cuda_graphs=False)
    assert graphed.fast_path.graphs.is_captured and not eager.fast_path.graphs.is_captured
    prompts = {f"r{i}": list(range(3 + i, 20 + 3 * i)) for i in range(5)}  # bucket 8, 3 padded
    for step_g, step_e in zip(drive(graphed, 5, prompts), drive(eager, 5, prompts)):
        for g, e in zip(step_g, step_e):
            assert g.token == e.token
            assert torch.equal(g.hidden, e.hidden)


def test_graphed_decode_step_has_no_host_sync(make_gpu_model) -> None:
    runner = runner_for(make_gpu_model(torch.bfloat16))
    runner.add_request("greedy", SamplingParams())
    runner.add_request("seeded", SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3))
    first = runner.step([StepInput("greedy", [1, 2, 3]), StepInput("seeded", [4, 5])])
    feed = [StepInput(r.request_id, [r.token], capture_hidden=True) for r in first]
    pending = launch_without_host_sync(runner, feed)
    results = pending.wait()
    assert all(r.token is not None and r.hidden is not None for r in results)


def test_eager_append_step_has_no_host_sync(make_gpu_model) -> None:
    runner = runner_for(make_gpu_model(torch.bfloat16))
    for rid in ("a", "b"):
        runner.add_request(rid, SamplingParams())
    runner.step([StepInput("a", [1, 2, 3]), StepInput("b", [4])])  # compiles the kernels
    pending = launch_without_host_sync(runner, [StepInput("a", list(range(13))), StepInput("b", [7])])
    assert len(pending.wait()) == 2


def test_device_noise_is_bitwise_the_cpu_noise() -> None:
    seeds = torch.tensor([0, 12345, (1 << 63) - 1, -7], dtype=torch.int64)
    assert torch.equal(uniform_noise(seeds.cuda(), 4096).cpu(), uniform_noise(seeds, 4096))
    assert math.isfinite(float(uniform_noise(seeds.cuda(), 10).log().min()))
