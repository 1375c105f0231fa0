"""Voices of session references for Code2Wav: a bounded LRU keyed by a content hash of the audio.

A stream whose first window carries REF_AUDIO (float32 mono, 16 kHz) starts from the voice of
that reference, prepared by token2wav exactly as the engine's default voice is
(`Token2Wav.voice_from_audio`: the prompt mel by the reference recipe; prompt codes and speaker
embedding from the checkpoint's S3 tokenizer and campplus, or from their documented stand-ins
when it has none, backends/models/token2wav/voice_assets.py).

Lifetimes are explicit: `acquire` prepares or reuses a voice and counts one user (a stream),
`release` ends that use. The least recently used voices nobody uses are dropped as soon as the
cache holds more than `capacity`; a voice in use is never dropped (its streams share its
prompt caches, which are never written in place), so memory is bounded by `capacity` plus the
voices of live streams, and every stream's end (finish, stop, error, a new epoch) releases it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from backends.audio.reference_cache import clip_key as voice_key  # the Thinker's reference cache keys the same way
from backends.contracts.messages import MAX_REF_AUDIO_SECONDS, MIN_REF_AUDIO_SAMPLES, REF_AUDIO_SAMPLE_RATE
from backends.models.token2wav import Voice

DEFAULT_CAPACITY = 8
ERROR_REF_AUDIO = "invalid_ref_audio"
_MAX_SAMPLES = MAX_REF_AUDIO_SECONDS * REF_AUDIO_SAMPLE_RATE


class VoiceBuilder(Protocol):
    def voice_from_audio(self, audio: torch.Tensor, sample_rate: int) -> Voice: ...


def reference_error(audio: np.ndarray, chunk_seq: int) -> str | None:
    """Why a window's REF_AUDIO cannot be used ("<code>: <detail>"), or None (empty = none)."""
    if audio.size == 0:
        return None
    if chunk_seq != 0:
        return (f"{ERROR_REF_AUDIO}: REF_AUDIO is read on the first window of a cache epoch only, "
                f"got it on chunk_seq {chunk_seq}")
    if audio.dtype != np.float32 or audio.ndim != 1:
        return f"{ERROR_REF_AUDIO}: REF_AUDIO must be float32 [n], got {audio.dtype.name} {list(audio.shape)}"
    if not MIN_REF_AUDIO_SAMPLES <= audio.size <= _MAX_SAMPLES:
        return (f"{ERROR_REF_AUDIO}: REF_AUDIO holds {audio.size} samples, needs {MIN_REF_AUDIO_SAMPLES}.."
                f"{_MAX_SAMPLES} ({MIN_REF_AUDIO_SAMPLES / REF_AUDIO_SAMPLE_RATE} to "
                f"{MAX_REF_AUDIO_SECONDS} s at {REF_AUDIO_SAMPLE_RATE} Hz)")
    if not np.isfinite(audio).all():
        return f"{ERROR_REF_AUDIO}: REF_AUDIO holds NaN or infinite samples"
    if np.abs(audio).max() > 1.0:
        return f"{ERROR_REF_AUDIO}: REF_AUDIO samples must lie in [-1, 1]"
    return None


@dataclass(slots=True)
class _Entry:
    voice: Voice
    users: int = 0


class VoiceCache:
    """Owned by the engine thread (no locking)."""

    def __init__(self, builder: VoiceBuilder, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"voice cache capacity must be >= 1, got {capacity}")
        self._builder = builder
        self.capacity = capacity
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self.num_prepared = 0  # voices prepared so far (one per cache miss)

    def acquire(self, audio: np.ndarray) -> tuple[str, Voice]:
        """The voice of `audio` ([n] float32 16 kHz), now used once more -> (key, voice)."""
        key = voice_key(audio)
        entry = self._entries.get(key)
        if entry is None:
            samples = torch.from_numpy(np.array(audio, dtype=np.float32))
            entry = _Entry(self._builder.voice_from_audio(samples, REF_AUDIO_SAMPLE_RATE))
            self._entries[key] = entry
            self.num_prepared += 1
        self._entries.move_to_end(key)
        entry.users += 1
        self._evict()
        return key, entry.voice

    def release(self, key: str) -> None:
        """End one use of the voice `key` (from `acquire`)."""
        entry = self._entries.get(key)
        if entry is None or entry.users == 0:
            raise KeyError(f"voice {key[:12]} is not in use")
        entry.users -= 1
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def num_users(self) -> int:
        return sum(entry.users for entry in self._entries.values())

    def _evict(self) -> None:
        idle = [key for key, entry in self._entries.items() if entry.users == 0]
        for key in idle[: max(0, len(self._entries) - self.capacity)]:
            del self._entries[key]
