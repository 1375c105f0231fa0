"""Cache cuts (docs/model_facts.md#code2wav-windows) on labelled caches: every frame holds its own
id, so the kept sets can be read off and compared with the documented rules.

Strategy: grow caches the way streaming does (DiT: new frames first; Conformer: chronological,
token rate at half the mel rate) with P = 300 prompt frames and 50 mel frames per window, cut
after each window, and check the steady state docs/model_facts.md#code2wav-windows describes: the
DiT keeps the newest P generated frames plus the last 100 prompt frames; the token-rate Conformer
cache freezes at the first (P + 100) / 2 positions; the mel-rate one keeps the prompt plus the
newest 100 frames.
"""

from __future__ import annotations

import torch

from backends.models.token2wav.cache_pruning import cut, prune_encoder_cache
from backends.models.token2wav.encoder import EncoderCache

PROMPT = 300
KEEP = 100
WINDOW = 50  # mel frames per window (25 codes)


def _ids(first: int, count: int) -> torch.Tensor:
    """[1, 1, count, 1] frames labelled first .. first + count - 1."""
    return torch.arange(first, first + count, dtype=torch.float32).view(1, 1, count, 1)


def test_cut_keeps_head_and_tail_only_when_too_long() -> None:
    sequence = torch.arange(10.0)
    assert torch.equal(cut(sequence, 0, 3, 2), torch.tensor([0.0, 1.0, 2.0, 8.0, 9.0]))
    assert cut(sequence, 0, 5, 5) is sequence


def test_dit_cache_keeps_newest_generated_and_last_prompt_frames() -> None:
    cache = torch.arange(-PROMPT, 0, dtype=torch.float32)  # the prompt: one chronological window
    for window in range(12):
        new = torch.arange(window * WINDOW, (window + 1) * WINDOW, dtype=torch.float32)
        cache = cut(torch.cat([new, cache]), 0, PROMPT, KEEP)
    kept = set(cache.tolist())
    generated = {i for i in kept if i >= 0}
    assert generated == set(range(12 * WINDOW - PROMPT, 12 * WINDOW))
    assert kept - generated == set(range(-KEEP, 0))
    assert cache.shape[0] == PROMPT + KEEP


def test_conformer_token_cache_freezes_and_mel_cache_keeps_the_newest() -> None:
    token = _ids(0, PROMPT // 2)
    cache = EncoderCache(torch.zeros(1, 2), torch.zeros(1, 4), token, _ids(0, PROMPT))
    for window in range(8):
        code_start = PROMPT // 2 + window * WINDOW // 2
        mel_start = PROMPT + window * WINDOW
        grown = EncoderCache(cache.lookahead, cache.upsample,
                             torch.cat([cache.token_kv, _ids(code_start, WINDOW // 2)], dim=2),
                             torch.cat([cache.mel_kv, _ids(mel_start, WINDOW)], dim=2))
        cache = prune_encoder_cache(grown, PROMPT, KEEP)
    assert cache.token_kv.flatten().tolist() == list(range((PROMPT + KEEP) // 2))
    newest = PROMPT + 8 * WINDOW
    expected_mel = list(range(PROMPT)) + list(range(newest - KEEP, newest))
    assert cache.mel_kv.flatten().tolist() == expected_mel
