"""Bounding a stream's attention caches: the prompt span plus the newest `keep` frames.

docs/model_facts.md#code2wav-windows: after every window the reference cuts any attention cache
longer than P + 100 (P = prompt mel frames) to its first P and last 100 frames, along the cache's
own layout. The layouts make the kept sets unintuitive, and parity needs them exactly:
- the DiT caches hold the newest frames first, so they keep the newest P frames and the last
  100 prompt frames;
- the reference stores the token-rate Conformer caches tiled twice along time (so they stack
  with the mel-rate ones) and reads back the first half; cutting the tiled copy freezes them
  at the first (P + 100) / 2 positions;
- the mel-rate Conformer caches are chronological: prompt frames plus the newest 100.
Here the token-rate caches are stored once; the tiling is redone only to cut them the same way.
"""

from __future__ import annotations

import torch

from backends.models.token2wav.cfm import EstimatorCache
from backends.models.token2wav.encoder import EncoderCache
from backends.models.token2wav.flow import FlowCache


def cut(sequence: torch.Tensor, dim: int, prompt_frames: int, keep: int) -> torch.Tensor:
    """The first `prompt_frames` and last `keep` frames along `dim`, if it is longer."""
    length = sequence.shape[dim]
    if length <= prompt_frames + keep:
        return sequence
    head = sequence.narrow(dim, 0, prompt_frames)
    return torch.cat([head, sequence.narrow(dim, length - keep, keep)], dim=dim)


def prune_flow_cache(cache: FlowCache, prompt_frames: int, keep: int) -> FlowCache:
    return FlowCache(
        encoder=prune_encoder_cache(cache.encoder, prompt_frames, keep),
        estimator=EstimatorCache(cut(cache.estimator.att, 4, prompt_frames, keep),
                                 cache.estimator.cnn),
    )


def prune_encoder_cache(cache: EncoderCache, prompt_frames: int, keep: int) -> EncoderCache:
    # token_kv / mel_kv: [layers, H, T, 2 dk]; the reference tests the shared (mel-rate) length
    if 2 * cache.token_kv.shape[2] <= prompt_frames + keep:
        return cache
    tiled = torch.cat([cache.token_kv, cache.token_kv], dim=2)
    kept = cut(tiled, 2, prompt_frames, keep)
    return EncoderCache(
        lookahead=cache.lookahead,
        upsample=cache.upsample,
        token_kv=kept[:, :, : kept.shape[2] // 2],
        mel_kv=cut(cache.mel_kv, 2, prompt_frames, keep),
    )
