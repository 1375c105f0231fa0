"""From Whisper encoder frames to LLM embeddings: MiniCPM-o's `audio_projection_layer.*`
(Linear -> ReLU -> Linear, both with bias) and the average pool that follows it.

The projector's input width is `encoder_ffn_dim // 4` upstream, which equals d_model with the
Whisper geometry (ffn = 4 * d_model). The pool averages non-overlapping groups of 5 frames
(AvgPool1d(5, stride=5)): 50 encoder frames per second become 10 embeddings per second; a
remainder of fewer than 5 frames is dropped, as AvgPool1d does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

AUDIO_POOL_STEP = 5  # encoder frames (20 ms each) averaged into one embedding (100 ms)


class MultiModalProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if in_dim <= 0 or out_dim <= 0:
            raise ValueError(f"projector widths must be positive, got {in_dim} -> {out_dim}")
        self.linear1 = nn.Linear(in_dim, out_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # [..., in_dim] -> [..., out_dim]
        return self.linear2(self.relu(self.linear1(frames)))


class AudioAvgPool(nn.Module):
    """Average non-overlapping groups of `step` frames along the time axis."""

    def __init__(self, step: int = AUDIO_POOL_STEP) -> None:
        super().__init__()
        if step <= 0:
            raise ValueError(f"pool step must be positive, got {step}")
        self.step = step

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # [n, hidden] or [batch, n, hidden] -> [n // step, hidden] or [batch, n // step, hidden]
        if frames.ndim not in (2, 3):
            raise ValueError(
                f"frames must be [n, hidden] or [batch, n, hidden], got {tuple(frames.shape)}")
        pooled = F.avg_pool1d(frames.transpose(-1, -2), self.step, self.step)
        return pooled.transpose(-1, -2)
