"""The pooled DiT attention caches (`estimator_pool`, `Token2Wav.enable_cache_pool`).

Strategy: the pool changes where caches live, not what the DiT sees (same keys, same order,
same zero padding), so pooled decoding must equal dense decoding exactly, cache cuts included
(a 2 s voice, P = 100: cuts fire from the third window), and every slot's cache read back
through its order must equal the dense stream's cut cache. Slot lifetimes: a finished, a
released and a dropped stream each give their slot back; a reused slot carries nothing of
its previous stream; a full pool raises a clear error; the fused kernel reads pooled rows
like dense ones (Triton's interpreter); padding a pooled window to a graph bucket changes
nothing.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from tiny_steps import tiny_with_steps

from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.models.token2wav.cache_pruning import cut
from backends.models.token2wav.dit import gather_cache
from backends.models.token2wav.estimator_pool import CachePoolFullError, PoolSlot
from backends.models.token2wav.graphs import pad_pooled_inputs

PAD_ATOL = 1e-5  # padding changes matmul shapes only (as in test_token2wav_graphs)


def _model(pool_streams: int, config: Token2WavConfig | None = None) -> Token2Wav:
    model = random_token2wav(config or Token2WavConfig.tiny(), seed=0)
    if pool_streams:
        model.enable_cache_pool(pool_streams)
    return model


def _voice(model: Token2Wav) -> Voice:
    return model.prepare_voice(random_voice_prompt(0))


def _plan(num_streams: int, num_windows: int) -> list[list[tuple[int, np.ndarray, bool]]]:
    """Per window: (stream, codes, last) rows; streams start late and windows differ in length."""
    rng = np.random.default_rng(3)
    plan = []
    for w in range(num_windows):
        rows = [(b, rng.integers(0, 6561, 22 if (w + b) % 3 == 0 else 28).astype(np.int32),
                 w == num_windows - 1 - b) for b in range(num_streams) if w >= b]
        plan.append([row for row in rows if w <= num_windows - 1 - row[0]])
    return plan


def _run(model: Token2Wav, plan) -> tuple[list[np.ndarray], list]:
    voice = _voice(model)
    streams = [model.new_stream(voice, seed=b) for b in range(max(r[0] for w in plan for r in w) + 1)]
    audio = []
    for rows in plan:
        audio += model.decode([StreamWindow(streams[b], codes, last) for b, codes, last in rows])
    return audio, streams


def test_pooled_decoding_equals_dense_exactly() -> None:
    plan = _plan(3, 6)
    dense, _ = _run(_model(0), plan)
    pooled_model = _model(4)
    pooled, _ = _run(pooled_model, plan)
    assert len(dense) == len(pooled)
    assert all(np.array_equal(a, b) for a, b in zip(dense, pooled))
    assert pooled_model.cache_pool.num_free() == 4  # every stream ended with a final window


def test_pooled_caches_equal_the_dense_cut_caches() -> None:
    plan = [[(b, codes, False) for b, codes, _ in rows] for rows in _plan(2, 5)[:4]]
    dense_model, pooled_model = _model(0), _model(2)
    _, dense_streams = _run(dense_model, plan)
    _, pooled_streams = _run(pooled_model, plan)
    pool = pooled_model.cache_pool
    for dense, pooled in zip(dense_streams, pooled_streams):
        slot = pooled.cache_slot
        expected = dense.flow_cache.estimator.att  # [steps, depth, 2, H, L, 2 dk]
        assert len(slot.order) == expected.shape[4] == 100 + 100  # P + keep: cuts fired
        rows = torch.tensor([2 * slot.index, 2 * slot.index + 1])
        order = torch.from_numpy(np.stack([slot.order, slot.order]))
        for step in range(expected.shape[0]):
            for layer in range(expected.shape[1]):
                got = gather_cache(pool.att[step, layer], rows, order)
                assert torch.equal(got, expected[step, layer])
        assert torch.equal(pooled.flow_cache.estimator.cnn, dense.flow_cache.estimator.cnn)


def test_a_reused_slot_carries_nothing_of_its_previous_stream() -> None:
    model = _model(1)
    voice = _voice(model)
    rng = np.random.default_rng(4)
    first = model.new_stream(voice, seed=1)
    for _ in range(4):
        model.decode([StreamWindow(first, rng.integers(0, 6561, 28).astype(np.int32), False)])
    index = first.cache_slot.index
    model.release_stream(first)
    codes = [rng.integers(0, 6561, 28).astype(np.int32) for _ in range(3)]
    second = model.new_stream(voice, seed=2)
    assert second.cache_slot.index == index
    reused = [model.decode([StreamWindow(second, c, False)])[0] for c in codes]
    fresh_model = _model(0)
    fresh = fresh_model.new_stream(_voice(fresh_model), seed=2)
    alone = [fresh_model.decode([StreamWindow(fresh, c, False)])[0] for c in codes]
    assert all(np.array_equal(a, b) for a, b in zip(reused, alone))


def test_grow_and_cut_keeps_what_the_dense_cut_keeps() -> None:
    """Random prompts, cache lengths, positions and window sizes (also windows longer than
    the prompt): the slot's frames in order equal cut([window | cache]); no kept frame is
    overwritten; positions stay distinct and inside the slot."""
    pool = _model(1).cache_pool
    rng = np.random.default_rng(7)
    for _ in range(200):
        prompt = int(rng.integers(1, 120))
        pool.capacity = prompt + pool.keep
        slot = PoolSlot(0, prompt, rng.permutation(pool.capacity)[: rng.integers(0, pool.capacity + 1)],
                        pool)
        content = {int(p): ("old", i) for i, p in enumerate(slot.order)}
        frames = int(rng.integers(1, 160))
        logical = [("new", t) for t in range(frames)] + [content[int(p)] for p in slot.order]
        expected = [logical[i] for i in cut(torch.arange(len(logical)), 0, prompt, pool.keep).tolist()]
        positions, kept = pool._grow_and_cut(slot, frames)
        assert not {content.get(int(p)) for p in positions} & set(expected)
        content.update({int(p): ("new", int(t)) for p, t in zip(positions, kept)})
        assert [content[int(p)] for p in slot.order] == expected
        assert len(set(slot.order.tolist())) == len(slot.order)
        assert slot.order.max(initial=0) < pool.capacity


def test_slots_are_bounded_and_every_way_out_frees_one() -> None:
    model = _model(2)
    voice, pool = _voice(model), model.cache_pool
    finished, released = model.new_stream(voice), model.new_stream(voice)
    with pytest.raises(CachePoolFullError, match="cache pool full: all 2"):
        model.new_stream(voice)
    model.decode([StreamWindow(finished, np.zeros(28, np.int32), True)])  # a final window
    assert pool.num_free() == 1
    model.release_stream(released)
    model.release_stream(released)  # idempotent
    assert pool.num_free() == 2
    dropped = model.new_stream(voice)
    assert pool.num_free() == 1
    del dropped
    gc.collect()
    assert pool.num_free() == 2
    with pytest.raises(ValueError, match="no live slot"):
        model.decode([StreamWindow(released, np.zeros(28, np.int32), False)])


def test_streams_from_before_the_pool_are_rejected() -> None:
    model = _model(0)
    stream = model.new_stream(_voice(model))
    model.enable_cache_pool(1)
    with pytest.raises(ValueError, match="no live slot"):
        model.decode([StreamWindow(stream, np.zeros(28, np.int32), False)])


def test_a_cache_longer_than_the_pool_is_rejected() -> None:
    model = _model(0)
    voice = _voice(model)
    model.enable_cache_pool(1, capacity=150)  # P = 100 + keep 100 does not fit
    with pytest.raises(ValueError, match="does not fit"):
        model.new_stream(voice)
    assert model.cache_pool.num_free() == 1


def test_padded_pooled_solve_equals_unpadded() -> None:
    model = _model(2)
    voice, pool, cfm = _voice(model), model.cache_pool, model.flow.decoder
    streams = [model.new_stream(voice) for _ in range(2)]
    generator = torch.Generator().manual_seed(5)
    mu = torch.randn(2, 80, 21, generator=generator)
    with torch.inference_mode():
        inputs = pool.pack(cfm, mu, [21, 13], torch.randn(2, 80, generator=generator),
                           torch.zeros_like(mu), [s.cache_slot for s in streams],
                           [s.flow_cache.estimator.cnn for s in streams])
        plain = cfm.solve_pooled(inputs, pool.att)
        padded = cfm.solve_pooled(pad_pooled_inputs(inputs, 24, 150, pool.zero_position), pool.att)
    torch.testing.assert_close(padded.mel[:, :, :21], plain.mel, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.new_kv[..., :21, :], plain.new_kv, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.cnn, plain.cnn, atol=PAD_ATOL, rtol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.interpreter
def test_fused_attention_reads_pooled_rows_like_dense_ones(dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    from backends.models.token2wav.dit_attention_kernel import masked_attention

    gen = torch.Generator().manual_seed(6)
    rows, heads, dim, frames, slots = 2, 2, 16, 21, 90
    qkv = torch.randn(rows * frames, 3 * heads * dim, generator=gen).to(dtype)
    norms = [torch.nn.LayerNorm(dim, eps=1e-5).to(dtype) for _ in range(2)]
    pool = torch.randn(5, heads, slots + 1, 2 * dim, generator=gen).to(dtype)
    pool[:, :, slots] = 0  # the zero position
    pool_rows = torch.tensor([3, 0])
    order = torch.stack([torch.randperm(slots, generator=gen)[:70],
                         torch.cat([torch.randperm(slots, generator=gen)[:40],
                                    torch.full((30,), slots)])])
    valid = torch.rand(rows, frames + 70, generator=gen) > 0.3
    valid[1, frames + 40 :] = False
    valid[:, 0] = True
    dense = gather_cache(pool, pool_rows, order)
    kv_dense, kv_pooled = (torch.empty(rows, heads, frames, 2 * dim, dtype=dtype) for _ in "ab")
    expected = masked_attention(qkv, norms[0], norms[1], dense, valid, kv_dense)
    got = masked_attention(qkv, norms[0], norms[1], pool, valid, kv_pooled, (pool_rows, order))
    assert torch.equal(got, expected) and torch.equal(kv_pooled, kv_dense)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pooled_graphed_fused_decoding_equals_dense_on_cuda(dtype: torch.dtype) -> None:
    """The served mode (fused kernels, graphs) with the pool against the dense caches: the
    same kernels over the same values; graphs are captured, then replayed."""
    plan = _plan(3, 6)
    outputs = []
    for pool_streams in (0, 4):
        model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
        model.set_flow_dtype(dtype)
        model.enable_cuda_graphs()
        if pool_streams:
            model.enable_cache_pool(pool_streams)
        outputs.append(_run(model, plan)[0] + _run(model, plan)[0])  # capture, then replay
    for a, b in zip(*outputs):
        np.testing.assert_allclose(a, b, atol=5e-4, rtol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.interpreter
def test_dit_over_a_pool_equals_dit_over_the_gathered_caches(fused: bool) -> None:
    """Whole tiny DiT (torch path, and fused kernels in Triton's interpreter): reading the
    caches through (rows, order) gives exactly what the dense caches give."""
    if fused:
        pytest.importorskip("triton")
    dit = random_token2wav(Token2WavConfig.tiny(), seed=0).flow.decoder.estimator
    dit.fused = fused
    c, gen = dit.config, torch.Generator().manual_seed(8)
    rows, frames, slots = 2, 9, 40
    pool = torch.randn(c.depth, 6, c.num_heads, slots + 1, 2 * c.head_dim, generator=gen)
    pool[:, :, :, slots] = 0
    pool_rows = torch.tensor([4, 1])
    order = torch.stack([torch.randperm(slots, generator=gen)[:30],
                         torch.cat([torch.randperm(slots, generator=gen)[:12],
                                    torch.full((18,), slots)])])
    dense = torch.stack([gather_cache(pool[d], pool_rows, order) for d in range(c.depth)])
    valid = torch.ones(rows, frames + 30, dtype=torch.bool)
    valid[1, frames + 12 :] = False
    shared = (torch.randn(rows, 320, frames, generator=gen), torch.rand(rows, generator=gen),
              torch.randn(c.depth, rows, 2 * c.hidden_size, 2, generator=gen))
    with torch.inference_mode():
        blocks, final = dit.modulations(shared[1])
        args = (shared[0], blocks, final, shared[2])
        expected = dit.forward_modulated(*args, dense, valid, torch.tensor([9, 5]))
        got = dit.forward_modulated(*args, pool, valid, torch.tensor([9, 5]), (pool_rows, order))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.interpreter
def test_scatter_kernel_writes_what_indexing_writes(dtype: torch.dtype) -> None:
    """`scatter_frames` (Triton's interpreter) against the torch indexing it replaces, on odd
    head counts and widths (masked lanes) and a strided new_kv; nothing else is touched."""
    pytest.importorskip("triton")
    from backends.models.token2wav.pool_scatter_kernel import scatter_frames

    gen = torch.Generator().manual_seed(9)
    steps, depth, heads, width, frames = 2, 3, 3, 10, 7
    att = torch.randn(steps, depth, 6, heads, 12, width, generator=gen).to(dtype)
    wide = torch.randn(steps, depth, 4, heads, frames + 2, width, generator=gen).to(dtype)
    new_kv = wide[:, :, :, :, 1 : frames + 1]  # not contiguous
    writes = torch.tensor([[0, 5, 5, 2, 3],  # pool rows
                           [11, 0, 4, 7, 0],  # positions
                           [0, 3, 2, 1, 1],  # DiT rows
                           [6, 0, 3, 2, 2]])  # window frames
    expected = att.clone()
    expected[:, :, writes[0], :, writes[1]] = new_kv[:, :, writes[2], :, writes[3]]
    scatter_frames(att, new_kv, writes)
    assert torch.equal(att, expected)
    scatter_frames(att, new_kv, writes[:, :0])  # no write is a no-op
    assert torch.equal(att, expected)
    with pytest.raises(ValueError, match="do not fit the pool"):
        scatter_frames(att, new_kv[:, :, :, :2], writes)
    with pytest.raises(ValueError, match="writes \\[4, W\\]"):
        scatter_frames(att, new_kv, writes[:3])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.interpreter
def test_commit_through_the_kernel_equals_commit_through_indexing() -> None:
    """A pool whose estimator runs fused kernels commits with `scatter_frames`: pools and
    slot orders come out equal to the torch commit's over windows whose cuts fire."""
    pytest.importorskip("triton")
    # Two Euler steps: the kernel's grid is (writes, steps x DiT blocks), the rule is per step
    models = [_model(2, tiny_with_steps(2)), _model(2, tiny_with_steps(2))]
    models[1].flow.decoder.estimator.fused = True
    pools = [model.cache_pool for model in models]
    steps, depth, _, heads, _, width = pools[0].att.shape
    gen = torch.Generator().manual_seed(10)
    first = torch.randn(steps, depth, 2, heads, 30, width, generator=gen)
    slots = [[pool.acquire(first, 20), pool.acquire(first[..., :10, :], 20)] for pool in pools]
    for _ in range(8):  # grows past prompt + keep: cuts fire
        new_kv = torch.randn(steps, depth, 4, heads, 12, width, generator=gen)
        for pool, pair in zip(pools, slots):
            pool.commit(new_kv, [12, 9], pair)
    assert torch.equal(pools[0].att, pools[1].att)
    assert all(np.array_equal(a.order, b.order) for a, b in zip(*slots))
    assert len(slots[0][0].order) == 20 + pools[0].keep
