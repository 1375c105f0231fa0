"""Where a streaming Whisper chunk's attention keeps its keys and values, and what it attends.

`EncoderKVCache` is one session's cache over the whole position table; `ChunkKV` is what the
encoder's attention writes a chunk's keys/values to (a session's cache, or a batch of them:
backends/audio/batched_encoder.py, backends/audio/encoder_graphs.py). `KeyEnds` stands in for
the bool key mask where the graphed pass attends through the split-key Triton kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from backends.models.whisper_encoder import WhisperEncoderConfig


@dataclass(slots=True)
class EncoderKVCache:
    """One session's self-attention keys/values, preallocated for the whole position table."""

    keys: torch.Tensor  # [encoder_layers, heads, max_source_positions, head_dim] model dtype
    values: torch.Tensor  # [encoder_layers, heads, max_source_positions, head_dim] model dtype
    length: int = 0  # frames held; they sit at positions [0, length)

    @classmethod
    def allocate(cls, config: WhisperEncoderConfig, dtype: torch.dtype,
                 device: torch.device) -> EncoderKVCache:
        shape = (config.encoder_layers, config.encoder_attention_heads,
                 config.max_source_positions, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's keys/values ([1, heads, n, head_dim]) after the held frames; return
        held + chunk as [1, heads, length + n, head_dim]. `length` advances once per chunk."""
        end = self.length + keys.shape[2]
        self.keys[layer, :, self.length:end] = keys[0]
        self.values[layer, :, self.length:end] = values[0]
        return self.keys[layer, :, :end].unsqueeze(0), self.values[layer, :, :end].unsqueeze(0)


class ChunkKV(Protocol):
    """What a streaming chunk's attention writes its keys/values to: one session's
    `EncoderKVCache`, or a batch of them (backends/audio/batched_encoder.py)."""

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True, slots=True)
class KeyEnds:
    """In place of a [rows, 1, 1, keys] bool mask True below each row's end: row r attends to
    keys [0, ends[r]) ([rows] int32), through backends/models/chunk_attention_kernel.py (which
    needs CUDA or Triton's interpreter)."""

    ends: torch.Tensor
