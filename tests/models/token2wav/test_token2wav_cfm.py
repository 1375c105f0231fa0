"""The CFM loop against the reference (stepaudio2-minicpmo 0.1.1), plus its batch packing.

Strategy: same weights and the same `rand_noise` stream (copied from the reference, which draws it
unseeded). Whole utterance: the reference's `forward` (noise from offset 0, full attention)
against one window over empty caches. Window by window: the reference's `forward_chunk` threading
its per-step caches, so the noise offset (= cache length), the cosine grid, the CFG combination
and the per-step caches are all compared; a stream of four windows includes the cache cut of
`Token2wav.stream`. The time grid is checked against the values quoted in
docs/model_facts.md#code2wav-token2wav. Batch: streams at different offsets in one call equal
separate calls.
"""

from __future__ import annotations

import copy

import torch

from backends.models.token2wav.cache_pruning import cut

# Measured <= 1.1e-6 on mel and caches after ten steps (the DiT's fused multiply-adds); a grid,
# CFG sign or noise-offset error is O(0.1).
PARITY_ATOL = 1e-5
# Ten steps of padded batch rows: float32 summation order only (measured ~1e-6).
BATCH_ATOL = 2e-5
FACTS_GRID = [0, .012312, .048943, .108993, .190983, .292893, .412215, .546009, .690983,
              .843566, 1]
GRID_ATOL = 1e-6  # docs/model_facts.md quotes 6 decimals


def test_time_grid_is_the_cosine_schedule(token2wav) -> None:
    grid = token2wav.flow.decoder.time_grid("cpu")
    torch.testing.assert_close(grid, torch.tensor(FACTS_GRID), atol=GRID_ATOL, rtol=0)


def test_whole_utterance_equals_reference_forward(pair) -> None:
    generator = torch.Generator().manual_seed(0)
    mu, cond = torch.randn(1, 80, 64, generator=generator), torch.randn(1, 80, 64, generator=generator)
    spk = torch.randn(1, 80, generator=generator)
    cfm = pair.ours.flow.decoder
    with torch.inference_mode():
        expected = pair.ref_flow.decoder.forward(mu, torch.ones(1, 1, 64), spk, cond, 10)
        got, _ = cfm.forward_chunk(mu, [64], spk, cond, [cfm.new_cache("cpu")])
    torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)


def test_window_by_window_equals_reference(pair) -> None:
    """A 60-frame prompt window with cond, then four 50-frame windows with cond = 0; both
    sides cut their caches to prompt + 100 after each window (the third cut fires)."""
    generator = torch.Generator().manual_seed(1)
    spk = torch.randn(1, 80, generator=generator)
    cfm = pair.ours.flow.decoder
    cache, ref_cnn, ref_att = cfm.new_cache("cpu"), None, None
    with torch.inference_mode():
        for index, frames in enumerate((60, 50, 50, 50, 50)):
            mu = torch.randn(1, 80, frames, generator=generator)
            cond = torch.randn(1, 80, frames, generator=generator) if index == 0 else torch.zeros(1, 80, frames)
            expected, ref_cnn, ref_att = pair.ref_flow.decoder.forward_chunk(
                mu, spk, cond, 10, 1.0, ref_cnn, ref_att)
            ref_cnn, ref_att = ref_cnn.clone(), cut(ref_att.clone(), 4, 60, 100)
            got, (cache,) = cfm.forward_chunk(mu, [frames], spk, cond, [cache])
            cache.att = cut(cache.att, 4, 60, 100)
            torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)
            torch.testing.assert_close(cache.att, ref_att, atol=PARITY_ATOL, rtol=0)
            torch.testing.assert_close(cache.cnn, ref_cnn, atol=PARITY_ATOL, rtol=0)
    assert cache.att.shape[4] == 160  # the cut held it at prompt + 100


def test_streams_at_different_offsets_batch_like_separate_calls(token2wav) -> None:
    cfm = token2wav.flow.decoder
    generator = torch.Generator().manual_seed(2)
    spk = torch.randn(3, 80, generator=generator)
    caches = []
    with torch.inference_mode():
        for row, history in enumerate((0, 1, 2)):  # 0, 1 or 2 earlier windows: offsets differ
            cache = cfm.new_cache("cpu")
            for _ in range(history):
                _, (cache,) = cfm.forward_chunk(torch.randn(1, 80, 40, generator=generator), [40],
                                                spk[row : row + 1], torch.zeros(1, 80, 40), [cache])
            caches.append(cache)
        frames = [50, 30, 44]
        mu = torch.randn(3, 80, 50, generator=generator)
        alone = [cfm.forward_chunk(mu[r : r + 1, :, : frames[r]], [frames[r]], spk[r : r + 1],
                                   torch.zeros(1, 80, frames[r]), [caches[r]]) for r in range(3)]
        together, grown = cfm.forward_chunk(mu, frames, spk, torch.zeros(3, 80, 50), caches)
    for row, (mel, (cache,)) in enumerate(alone):
        torch.testing.assert_close(together[row, :, : frames[row]], mel[0], atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(grown[row].att, cache.att, atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(grown[row].cnn, cache.cnn, atol=BATCH_ATOL, rtol=0)


def test_step_constants_are_kept_until_a_weight_changes(token2wav) -> None:
    """The step sizes and the adaLN outputs of the ten step times are computed once per set
    of weights: a later window reuses them; an in-place weight change (a load) recomputes them
    into the same tensors (which captured graphs read); nothing is kept while autograd
    records."""
    cfm = copy.deepcopy(token2wav.flow.decoder)  # the session fixture stays untouched
    real, calls = cfm.estimator.modulations, []
    cfm.estimator.modulations = lambda t: (calls.append(t), real(t))[1]
    cpu = torch.device("cpu")
    cfm.step_constants(cpu)  # autograd on: computed, not kept
    with torch.no_grad():
        first = cfm.step_constants(cpu)
        before = [t.clone() for t in first]
        again = cfm.step_constants(cpu)
        assert len(calls) == 2 and all(a is b for a, b in zip(again, first))
        cfm.estimator.blocks[-1].adaLN_modulation[1].weight.mul_(2.0)
        changed = cfm.step_constants(cpu)
        assert len(calls) == 3 and all(a is b for a, b in zip(changed, first))
        assert not torch.equal(changed[1], before[1])
        times, steps = cfm.step_times(cpu)
        expected = (steps, *real(times))
        cfm.to(torch.float64)  # new weight tensors of another dtype: new constants
        other = cfm.step_constants(cpu)
        assert other[1].dtype == torch.float64 and len(cfm._retired) == 3
    for got, want in zip(changed, expected):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_step_constants_of_weights_made_in_inference_mode(token2wav) -> None:
    with torch.inference_mode():
        cfm = copy.deepcopy(token2wav.flow.decoder).to(torch.float64)  # inference tensors now
        assert cfm.estimator.in_proj.weight.is_inference()
        first = cfm.step_constants(torch.device("cpu"))
        assert all(a is b for a, b in zip(cfm.step_constants(torch.device("cpu")), first))
