"""Reference-voice embeddings shared by a Thinker's sessions, keyed by the clip's content.

A session that sends REF_AUDIO has the clip encoded by the Whisper tower at its first append
(non-streaming, eager, tens of ms of the engine thread while every other session waits). Many
sessions use the same few voices (a product's preset voices; the duplex benchmark's bundled
ones), so the embeddings are kept in a small LRU by content hash: a repeated voice costs a
hash. Entries are read-only (prompt assembly copies them into the prompt's rows).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

DEFAULT_REFERENCE_CACHE = 16  # clips; each [n / 1600, hidden] (~5 MB for 30 s at 4096 bf16)


def clip_key(samples: np.ndarray) -> str:
    """sha256 of the clip's float32 samples (also the Code2Wav voice cache's key)."""
    return hashlib.sha256(np.ascontiguousarray(samples, dtype=np.float32).tobytes()).hexdigest()


class ReferenceCache:
    """LRU of encoded clips; capacity 0 turns caching off."""

    def __init__(self, capacity: int = DEFAULT_REFERENCE_CACHE) -> None:
        if capacity < 0:
            raise ValueError(f"reference cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_encode(self, samples: np.ndarray, encode: Callable[[np.ndarray], torch.Tensor]) -> torch.Tensor:
        if self.capacity == 0:
            return encode(samples)
        key = clip_key(samples)
        embeds = self._entries.get(key)
        if embeds is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return embeds
        self.misses += 1
        embeds = self._entries[key] = encode(samples)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return embeds
