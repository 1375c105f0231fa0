"""The DiT estimator against the reference (stepaudio2-minicpmo 0.1.1), plus the padded batch.

Strategy: same random weights (adaLN and output layers re-randomised, since the reference
zero-initialises them and would output 0). Whole utterance: the reference's `forward` with an
all-ones mask against `forward_chunk` over empty caches. Window by window: the reference's
`forward_chunk` threading its caches (keys new-first) against ours, comparing the velocity and
both caches. Batch: two rows with different cache and window lengths, padded and masked, equal
the rows run alone.
"""

from __future__ import annotations

import torch

# Measured <= 7e-7: the same float32 operations except fused multiply-adds for the adaLN
# modulation and gates (one rounding instead of two); a layout or modulation-order error is
# O(0.1).
PARITY_ATOL = 1e-5
# Padded rows: other SDPA/conv shapes, float32 summation order only (measured < 1e-6).
BATCH_ATOL = 1e-5


def _inputs(generator: torch.Generator, rows: int, frames: int) -> tuple[torch.Tensor, ...]:
    x, mu, cond = (torch.randn(rows, 80, frames, generator=generator) for _ in range(3))
    return x, mu, cond


def _empty(dit, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    c = dit.config
    return (torch.zeros(c.depth, rows, 2 * c.hidden_size, 2),
            torch.zeros(c.depth, rows, c.num_heads, 0, 2 * c.head_dim))


def _packed(x, mu, spk, cond) -> torch.Tensor:
    return torch.cat([x, mu, spk[:, :, None].expand_as(x), cond], dim=1)


def test_whole_utterance_equals_reference_forward(pair) -> None:
    generator = torch.Generator().manual_seed(0)
    x, mu, cond = _inputs(generator, 2, 37)
    spk, t = torch.randn(2, 80, generator=generator), torch.rand(2, generator=generator)
    ours, theirs = pair.ours.flow.decoder.estimator, pair.ref_flow.decoder.estimator
    with torch.inference_mode():
        expected = theirs.forward(x, torch.ones(2, 1, 37), mu, t, spk, cond)
        cnn, att = _empty(ours, 2)
        got, _, _ = ours.forward_chunk(_packed(x, mu, spk, cond), t, cnn, att,
                                       torch.ones(2, 37, dtype=torch.bool), torch.full((2,), 37))
    torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)


def test_window_by_window_equals_reference(pair) -> None:
    generator = torch.Generator().manual_seed(1)
    spk, t = torch.randn(2, 80, generator=generator), torch.rand(2, generator=generator)
    ours, theirs = pair.ours.flow.decoder.estimator, pair.ref_flow.decoder.estimator
    cnn, att = _empty(ours, 2)
    ref_cnn = ref_att = None
    with torch.inference_mode():
        for frames in (30, 50, 50, 7):
            x, mu, cond = _inputs(generator, 2, frames)
            expected, ref_cnn, ref_att = theirs.forward_chunk(x, mu, t, spk, cond, ref_cnn, ref_att)
            ref_cnn, ref_att = ref_cnn.clone(), ref_att.clone()  # views of a reused buffer
            valid = torch.ones(2, frames + att.shape[3], dtype=torch.bool)
            got, cnn, new_kv = ours.forward_chunk(_packed(x, mu, spk, cond), t, cnn, att, valid,
                                                  torch.full((2,), frames))
            att = torch.cat([new_kv, att], dim=3)
            torch.testing.assert_close(got, expected, atol=PARITY_ATOL, rtol=0)
            torch.testing.assert_close(cnn, ref_cnn, atol=PARITY_ATOL, rtol=0)
            torch.testing.assert_close(att, ref_att, atol=PARITY_ATOL, rtol=0)


def test_padded_rows_equal_rows_alone(token2wav) -> None:
    """Row 0: 50 new frames over 60 cached; row 1: 20 new over 90 cached. The batch pads both
    to 50 | 90 and masks; padding must not leak into either row."""
    dit = token2wav.flow.decoder.estimator
    c = dit.config
    generator = torch.Generator().manual_seed(2)
    lengths, caches = [(50, 60), (20, 90)], []
    alone = []
    with torch.inference_mode():
        for frames, cached in lengths:
            inputs = torch.randn(1, 320, frames, generator=generator)
            cnn = torch.randn(c.depth, 1, 2 * c.hidden_size, 2, generator=generator)
            att = torch.randn(c.depth, 1, c.num_heads, cached, 2 * c.head_dim, generator=generator)
            caches.append((inputs, cnn, att))
            valid = torch.ones(1, frames + cached, dtype=torch.bool)
            alone.append(dit.forward_chunk(inputs, torch.full((1,), 0.3), cnn, att, valid,
                                           torch.tensor([frames])))
        batch_in = torch.zeros(2, 320, 50)
        batch_att = torch.zeros(c.depth, 2, c.num_heads, 90, 2 * c.head_dim)
        valid = torch.zeros(2, 50 + 90, dtype=torch.bool)
        for row, ((frames, cached), (inputs, _, att)) in enumerate(zip(lengths, caches)):
            batch_in[row, :, :frames] = inputs[0]
            batch_att[:, row, :, :cached] = att[:, 0]
            valid[row, :frames] = True
            valid[row, 50 : 50 + cached] = True
        batch_cnn = torch.cat([cnn for _, cnn, _ in caches], dim=1)
        out, cnn, kv = dit.forward_chunk(batch_in, torch.full((2,), 0.3), batch_cnn, batch_att,
                                         valid, torch.tensor([50, 20]))
    for row, ((frames, _), (expected, exp_cnn, exp_kv)) in enumerate(zip(lengths, alone)):
        torch.testing.assert_close(out[row, :, :frames], expected[0], atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(cnn[:, row], exp_cnn[:, 0], atol=BATCH_ATOL, rtol=0)
        torch.testing.assert_close(kv[:, row, :, :frames], exp_kv[:, 0], atol=BATCH_ATOL, rtol=0)
