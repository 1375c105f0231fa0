"""Mixed-batch graphs (appends next to decodes), host side and eager replay, on CPU.

Strategy: literal cases for the bucket set and the bucket chooser; the staged int64/int32
buffers of a two-request step are checked field by field (real rows from contexts and block
rows, padding rows on the pad block, padded requests empty); the padded, bucketed attention
launch (grid and split count from the bucket, metadata read on the device) must equal the
unpadded launch on random mixed metadata in Triton's interpreter, bit for bit with the same
split count, and write zeros into its padding rows; finally two runners, mixed graphs on and
off, serve the same random add/append/decode/finish sequence with the same tokens. Graph
capture itself needs CUDA and is covered in tests/runner_gpu.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import test_attention as cases  # noqa: E402  (the sibling module's case builder)

from backends.runner.mixed_graphs import MixedGraphs  # noqa: E402
from backends.runner.mixed_layout import MixedLayout, choose_bucket, mixed_buckets  # noqa: E402
from backends.runner.triton_paged_attention import paged_attention_triton  # noqa: E402
from backends.runner.types import SampleContext, SamplingParams, StepInput  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HIDDEN_ATOL = 2e-5  # float32; the padded launch may pick another split count


def test_bucket_set_holds_every_mixed_batch() -> None:
    buckets = mixed_buckets((1, 2, 4), (8, 16, 32), max_query_len=8)
    # R=1 holds at most 8 rows; R=2 at least 3 rows (n >= 2, one request appends)
    assert buckets == ((1, 8), (2, 8), (2, 16), (4, 8), (4, 16), (4, 32))
    for num_reqs in range(1, 5):
        for num_tokens in range(num_reqs + 1, num_reqs * 8 + 1):
            rows = [1] * (num_reqs - 1) + [num_tokens - num_reqs + 1]
            if max(rows) <= 8:
                assert choose_bucket(buckets, rows, 8) is not None, rows


def test_choose_bucket() -> None:
    buckets = mixed_buckets((1, 2, 4, 8), (16, 32, 64), max_query_len=32)
    assert choose_bucket(buckets, [13], 32) == (1, 16)
    assert choose_bucket(buckets, [13, 1, 1], 32) == (4, 16)
    assert choose_bucket(buckets, [13, 14, 1, 1, 1], 32) == (8, 32)
    assert choose_bucket(buckets, [33, 1], 32) is None  # a long prefill stays eager
    assert choose_bucket(buckets, [32] * 3, 32) is None  # 96 rows: no token bucket
    assert choose_bucket([(4, 32)], [3, 1], 32) == (4, 32)  # the next captured bucket


LAYOUT = MixedLayout(max_reqs=4, max_tokens=8, max_blocks=3, max_query_len=4, max_seq_len=12,
                     block_size=4, pad_block=9)  # fmt: skip


def test_stage_into_a_used_buffer_equals_a_fresh_one() -> None:
    """Staging writes every element of the twin it is given: a small step over a buffer that
    held a larger one stages exactly what a new array gets."""
    big = (np.array([4, 3, 1]), np.array([1, 7, 0]),
           np.array([[1, 2, 3], [4, 5, 6], [0, -1, -1]], dtype=np.int32))
    small = (np.array([2]), np.array([3]), np.array([[6, 2, -1]], dtype=np.int32))
    i64 = LAYOUT.stage_i64(*big, np.arange(1, 9), [3, 6, 7])
    i32 = LAYOUT.stage_i32(*big)
    LAYOUT.stage_i64(*small, np.array([5, 6]), [1], out=i64)
    LAYOUT.stage_i32(*small, out=i32)
    assert i64.tolist() == LAYOUT.stage_i64(*small, np.array([5, 6]), [1]).tolist()
    assert i32.tolist() == LAYOUT.stage_i32(*small).tolist()


def test_stage_fills_real_and_padding_rows() -> None:
    num_rows, contexts = np.array([3, 1]), np.array([5, 2])
    block_rows = np.array([[5, 1, -1], [7, -1, -1]], dtype=np.int32)
    i64 = torch.from_numpy(LAYOUT.stage_i64(num_rows, contexts, block_rows,
                                            np.array([11, 12, 13, 14]), [2, 3]))  # fmt: skip
    i32 = torch.from_numpy(LAYOUT.stage_i32(num_rows, contexts, block_rows))
    view = LAYOUT.views(i64, i32)
    assert view["token_ids"].tolist() == [11, 12, 13, 14, 0, 0, 0, 0]
    assert view["positions"].tolist() == [5, 6, 7, 2, 0, 0, 0, 0]
    assert view["slot_mapping"].tolist() == [5, 6, 7, 30] + [36] * 4  # pad rows: block 9
    assert view["logit_rows"].tolist() == [2, 3, 0, 0]
    assert view["query_start_loc"].tolist() == [0, 3, 4, 4, 4]  # padded requests: no rows
    assert view["seq_lens"].tolist() == [8, 3, 0, 0]
    assert view["context_lens"].tolist() == [5, 2, 0, 0]
    assert view["block_tables"].tolist() == [[5, 1, -1], [7, -1, -1], [9, -1, -1], [9, -1, -1]]
    meta = LAYOUT.metadata(i64, i32, (2, 8))
    assert meta.query_start_loc_np.tolist() == [0, 4, 8]  # bounds: Q rows each, T in all
    assert meta.seq_lens_np.tolist() == [12, 12] and meta.pad_tail
    assert meta.slot_mapping.shape == (8,) and meta.block_tables.shape == (2, 3)


def test_stage_embeds_tokens_and_injected_rows(qwen3, make_runner) -> None:
    runner = make_runner(attention_backend="triton", max_num_reqs=4, mixed_graph_tokens=(8,),
                         mixed_graph_max_query_len=4)  # fmt: skip
    mixed = runner.fast_path.mixed
    assert isinstance(mixed, MixedGraphs) and mixed.buckets == ((1, 8), (2, 8), (4, 8))
    injected = torch.randn(2, qwen3.hidden_size)
    inputs = [StepInput("a", [3, 4, 5]), StepInput("b", [0, 0], injected)]
    block_rows = np.array([[1, 2] + [-1] * 30, [3] + [-1] * 31], dtype=np.int32)
    cu = mixed.stage((2, 8), inputs, np.array([0, 4]), block_rows, [1])
    assert cu.tolist() == [0, 3, 5]
    expected = qwen3.embed_tokens(torch.tensor([3, 4, 5, 0, 0, 0, 0, 0]))
    torch.testing.assert_close(mixed.embeds[:3], expected[:3])
    torch.testing.assert_close(mixed.embeds[3:5], injected)
    torch.testing.assert_close(mixed.embeds[5:8], expected[5:])
    assert mixed._views["logit_rows"].tolist() == [4, 0, 0, 0]


def padded_case(seed: int, splits: int | None):
    """Random mixed lengths; returns (unpadded out, padded out, real rows)."""
    rng = np.random.default_rng(seed)
    num_reqs = int(rng.integers(1, 6))
    queries = [int(q) if rng.random() < 0.5 else 1 for q in rng.integers(2, 9, num_reqs)]
    contexts = [int(c) for c in rng.integers(0, 41, num_reqs)]
    query, k_cache, v_cache, meta, _ = cases.build_case(contexts, queries, seed=seed)
    scale = cases.HEAD_DIM**-0.5
    expected = paged_attention_triton(query, k_cache, v_cache, meta, scale, splits=splits)
    buckets = mixed_buckets((1, 2, 4, 8), (8, 16, 32, 64), max_query_len=8)
    reqs, tokens = choose_bucket(buckets, queries, 8) or (8, 64)  # all-decode: any bucket
    layout = MixedLayout(max_reqs=8, max_tokens=64, max_blocks=meta.block_tables.shape[1],
                         max_query_len=8, max_seq_len=64, block_size=cases.BLOCK_SIZE,
                         pad_block=k_cache.shape[0] - 1)  # fmt: skip
    num_rows, ctx = np.array(queries), np.array(contexts)
    tables = meta.block_tables.numpy()
    i64 = layout.stage_i64(num_rows, ctx, tables, np.zeros(sum(queries), np.int64), [])
    i32 = layout.stage_i32(num_rows, ctx, tables)
    padded_meta = layout.metadata(torch.from_numpy(i64), torch.from_numpy(i32), (reqs, tokens))
    garbage = torch.full((tokens - len(query), *query.shape[1:]), 1e30)
    padded = torch.cat([query, garbage])
    out = paged_attention_triton(padded, k_cache, v_cache, padded_meta, scale, splits=splits)
    return expected, out, len(query)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.interpreter
def test_padded_launch_equals_unpadded_launch(seed: int) -> None:
    expected, out, num_real = padded_case(seed, splits=3)
    assert torch.equal(out[:num_real], expected), "same splits must give the same bits"
    assert not out[num_real:].any(), "padding rows must come out as zeros"
    expected, out, num_real = padded_case(seed, splits=None)  # bucket's own split count
    torch.testing.assert_close(out[:num_real], expected, atol=2e-6, rtol=0)
    assert not out[num_real:].any()


class BanHook:
    """Bans one token (a host-only policy, so its row is sampled on the host)."""

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        logits[7] = float("-inf")
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


def serve_random_steps(runner, qwen3, seed: int, num_steps: int) -> list[list[tuple]]:
    """Random sessions: each step some append 2-6 rows (some injected, some unsampled), the
    others decode their last token; sessions finish and new ones join."""
    rnd, log, last, serial = random.Random(seed), [], {}, 0
    for step in range(num_steps):
        while len(last) < 4:
            rid, serial = f"s{serial}", serial + 1
            hook = BanHook() if serial % 3 == 0 else None
            runner.add_request(rid, SamplingParams(temperature=0.7 * (serial % 2), seed=serial),
                               hook=hook)  # fmt: skip
            last[rid] = None
        inputs = [random_input(rnd, rid, tok, qwen3) for rid, tok in last.items()]
        results = runner.step(inputs)
        log.append([(r.request_id, r.positions, r.token, r.hidden) for r in results])
        for r in results:
            last[r.request_id] = r.token
        if step % 3 == 2:
            done = rnd.choice(sorted(last))
            runner.free_request(done)
            del last[done]
    return log


def random_input(rnd: random.Random, rid: str, token: int | None, qwen3) -> StepInput:
    if token is not None and rnd.random() < 0.6:
        return StepInput(rid, [token], capture_hidden=rnd.random() < 0.5)
    rows = rnd.randint(2, 6)
    embeds = None
    if rnd.random() < 0.3:
        embeds = qwen3.embed_tokens(torch.tensor([rnd.randint(1, 200)] * rows)).detach()
    return StepInput(rid, [rnd.randint(1, 200) for _ in range(rows)], embeds,
                     sample=rnd.random() < 0.8, capture_hidden=rnd.random() < 0.5)  # fmt: skip


@pytest.mark.interpreter
def test_runner_serves_the_same_tokens_with_and_without_mixed_graphs(
    make_runner, qwen3_one_layer, monkeypatch
) -> None:
    """One decoder layer (what mixed graphs stage is per step, not per layer) and 7 steps:
    appends, injected and unsampled rows, decodes, two finished sessions and two new ones."""
    settings = dict(attention_backend="triton", max_num_reqs=4, cuda_graph_sizes=(1, 2, 4),
                    mixed_graph_tokens=(8, 16, 32), mixed_graph_max_query_len=6)  # fmt: skip
    model = qwen3_one_layer
    graphed = make_runner(model, **settings)
    eager = make_runner(model, **settings, mixed_cuda_graphs=False)
    assert eager.fast_path.mixed is None
    used = []
    run = MixedGraphs.run
    monkeypatch.setattr(MixedGraphs, "run", lambda self, b: used.append(b) or run(self, b))
    got = serve_random_steps(graphed, model, seed=5, num_steps=7)
    assert used, "no step went through the mixed buffers"
    expected = serve_random_steps(eager, model, seed=5, num_steps=7)
    for step, (g_step, e_step) in enumerate(zip(got, expected)):
        for g, e in zip(g_step, e_step):
            assert g[:3] == e[:3], f"step {step}: {g[:3]} != {e[:3]}"
            assert (g[3] is None) == (e[3] is None)
            if e[3] is not None:
                torch.testing.assert_close(g[3], e[3], atol=HIDDEN_ATOL, rtol=0)
