"""`UpsampleConformerEncoderV2` against the reference (stepaudio2-minicpmo 0.1.1), plus the
padded batch path.

Strategy: the `pair` fixture builds the reference with random weights and loads its state dict
into ours strictly (so the flow.pt key names are checked too). Whole utterance: the reference's
`forward` against one final window over empty caches. Window by window: the reference's
`forward_chunk` with its packed caches (token-rate half tiled) against ours, through the cache
cuts `Token2wav.stream` applies (prompt + 100 frames), comparing outputs and kept caches. Batch:
rows at different cache lengths and window sizes in one call against one call per row.
"""

from __future__ import annotations

import pytest
import torch

from backends.models.token2wav.cache_pruning import prune_encoder_cache
from backends.models.token2wav.rel_position import RelPositionalEncoding, shift_scores

# Measured 0.0: the same float32 operations in the same order. The bound leaves room for other
# BLAS blockings; a wrong distance, bias or cache layout changes outputs by O(0.1).
PARITY_ATOL = 1e-5
# Padded rows take other matmul shapes: float32 summation order only (measured ~1e-6).
BATCH_ATOL = 1e-5
PROMPT_CODES = 40  # P = 80 mel frames: the cuts fire from the third window on
KEEP = 100


def _codes(seed: int, count: int) -> torch.Tensor:
    return torch.randint(0, 6561, (1, count), generator=torch.Generator().manual_seed(seed))


def test_whole_utterance_equals_reference_forward(pair) -> None:
    codes = _codes(0, 61)
    with torch.inference_mode():
        xs = pair.ref_flow.input_embedding(codes)
        expected, _ = pair.ref_flow.encoder(xs, torch.tensor([codes.shape[1]]))
        encoder = pair.ours.flow.encoder
        got, frames, _ = encoder.forward_chunk(xs, [61], [True], [encoder.new_cache("cpu")])
    assert frames == [122]
    torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)


def test_window_by_window_equals_reference_with_cache_cuts(pair) -> None:
    """Setup window (prompt + 3 look-ahead codes), five 28-code windows, a final 11-code one."""
    codes = _codes(1, PROMPT_CODES + 3 + 5 * 25 + 8)
    bounds = [(0, PROMPT_CODES + 3, False)]
    bounds += [(PROMPT_CODES + 25 * k, PROMPT_CODES + 25 * k + 28, False) for k in range(5)]
    bounds += [(PROMPT_CODES + 125, codes.shape[1], True)]
    prompt_frames = 2 * PROMPT_CODES
    encoder = pair.ours.flow.encoder
    cache, ref_cnn, ref_att = encoder.new_cache("cpu"), None, None
    with torch.inference_mode():
        for start, stop, last in bounds:
            xs = pair.ref_flow.input_embedding(codes[:, start:stop])
            expected, ref_cnn, ref_att = pair.ref_flow.encoder.forward_chunk(
                xs, last_chunk=last, cnn_cache=ref_cnn, att_cache=ref_att)
            got, _, (cache,) = encoder.forward_chunk(xs, [stop - start], [last], [cache])
            torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)
            ref_att = _reference_cut(ref_att, prompt_frames)
            cache = prune_encoder_cache(cache, prompt_frames, KEEP)
            _assert_same_cache(cache, ref_cnn, ref_att, encoder.config.num_blocks)


def _reference_cut(att: torch.Tensor, prompt_frames: int) -> torch.Tensor:
    """`Token2wav.stream`'s conformer cut on the packed [layers, 1, H, L, 2 dk] cache."""
    if att.shape[3] <= prompt_frames + KEEP:
        return att
    return torch.cat([att[:, :, :, :prompt_frames], att[:, :, :, -KEEP:]], dim=3)


def _assert_same_cache(cache, ref_cnn: torch.Tensor, ref_att: torch.Tensor, num_blocks: int) -> None:
    half = ref_att.shape[3] // 2
    torch.testing.assert_close(cache.token_kv, ref_att[:num_blocks, 0, :, :half], atol=PARITY_ATOL, rtol=0)
    torch.testing.assert_close(cache.mel_kv, ref_att[num_blocks:, 0], atol=PARITY_ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([cache.lookahead, cache.upsample], 1), ref_cnn[0])


def test_rows_of_one_batch_equal_separate_calls(token2wav) -> None:
    encoder = token2wav.flow.encoder
    embed = token2wav.flow.input_embedding
    plans = [(7, [(30, False)]), (8, [(43, False), (28, False)]), (9, [(12, True)])]
    with torch.inference_mode():
        caches = []
        for seed, history in plans:  # bring each row to its own cache length
            cache = encoder.new_cache("cpu")
            for count, last in history[:-1]:
                _, _, (cache,) = encoder.forward_chunk(embed(_codes(seed, count)), [count], [last], [cache])
            caches.append(cache)
        windows = [(_codes(seed + 10, history[-1][0]), history[-1][1]) for seed, history in plans]
        alone = [encoder.forward_chunk(embed(c), [c.shape[1]], [last], [cache])
                 for (c, last), cache in zip(windows, caches)]
        padded = torch.zeros(3, 43, dtype=torch.int64)
        for row, (c, _) in enumerate(windows):
            padded[row, : c.shape[1]] = c[0]
        together, frames, grown = encoder.forward_chunk(
            embed(padded), [c.shape[1] for c, _ in windows], [last for _, last in windows], caches)
    for row, (out, row_frames, (cache,)) in enumerate(alone):
        assert frames[row] == row_frames[0]
        torch.testing.assert_close(together[row, : frames[row]], out[0], atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(grown[row].mel_kv, cache.mel_kv, atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(grown[row].lookahead, cache.lookahead, atol=BATCH_ATOL, rtol=0)


def test_shift_scores_reads_distance_c_plus_i_minus_j() -> None:
    """Entry (i, j) of the shifted scores must hold the product with the row of distance
    C + i - j (the reference's rel_shift with fewer queries than keys)."""
    table = RelPositionalEncoding(4, 50)
    num_cache, num_new = 5, 3
    num_keys = num_cache + num_new
    rows = table.relative_rows(num_keys, num_new)  # distances num_keys - 1 .. -(num_new - 1)
    distances = torch.arange(num_keys - 1, -num_new, -1, dtype=torch.float32)
    scores = distances.expand(num_new, -1)  # "product" = the distance itself
    shifted = shift_scores(scores, num_keys)
    expected = num_cache + torch.arange(num_new)[:, None] - torch.arange(num_keys)[None, :]
    assert torch.equal(shifted, expected.float())
    assert rows.shape == (num_keys + num_new - 1, 4)
    with pytest.raises(ValueError, match="relative-position table"):
        table.relative_rows(51, 1)
