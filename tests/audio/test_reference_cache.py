"""Reference-voice embeddings shared by a Thinker's sessions (`reference_cache`).

Strategy: the cache must be invisible but for its cost: a session whose voice another session
already sent gets the very embeddings a fresh encode gives, without running the tower; a
different clip (even by one sample) is encoded; the LRU holds at most `capacity` clips, and
capacity 0 encodes every time.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.reference_cache import ReferenceCache
from backends.audio.streaming_encoder import StreamingAudioEncoder


def _clip(seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(16000)).astype(np.float32)


def _counting(calls: list[int]):
    def encode(samples: np.ndarray) -> torch.Tensor:
        calls.append(1)
        return torch.from_numpy(samples[:4].copy())
    return encode


def test_lru_hits_misses_and_eviction() -> None:
    cache, calls = ReferenceCache(capacity=2), []
    encode = _counting(calls)
    a, b, c = _clip(1), _clip(2), _clip(3)
    first = cache.get_or_encode(a, encode)
    assert cache.get_or_encode(a.copy(), encode) is first  # same content, another array
    cache.get_or_encode(b, encode)
    cache.get_or_encode(a, encode)  # a is now the most recent
    cache.get_or_encode(c, encode)  # evicts b
    assert len(cache) == 2 and (cache.hits, cache.misses) == (2, 3)
    cache.get_or_encode(b, encode)
    assert len(calls) == 4
    changed = a.copy()
    changed[-1] += 1e-3
    cache.get_or_encode(changed, encode)
    assert len(calls) == 5


def test_capacity_zero_encodes_every_time() -> None:
    cache, calls = ReferenceCache(capacity=0), []
    for _ in range(3):
        cache.get_or_encode(_clip(1), _counting(calls))
    assert len(calls) == 3 and len(cache) == 0
    with pytest.raises(ValueError, match=">= 0"):
        ReferenceCache(capacity=-1)


def test_sessions_sharing_a_cache_get_fresh_embeddings_without_encoding(tiny_model: AudioEncoderModel,
                                                                        monkeypatch) -> None:
    clip = np.concatenate([_clip(4), _clip(5), _clip(6)])[:46400]
    fresh = StreamingAudioEncoder(tiny_model).encode_reference(clip)
    shared = ReferenceCache()
    first = StreamingAudioEncoder(tiny_model, references=shared)
    torch.testing.assert_close(first.encode_reference(clip), fresh, rtol=0, atol=0)
    second = StreamingAudioEncoder(tiny_model, references=shared)
    monkeypatch.setattr(second, "_encode_reference", lambda samples: pytest.fail("encoded again"))
    torch.testing.assert_close(second.encode_reference(clip.copy()), fresh, rtol=0, atol=0)
    assert (shared.hits, shared.misses) == (1, 1)
