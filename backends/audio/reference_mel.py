"""The reference voice clip's log-mel, as the official processor computes it for the prompt.

MiniCPM-o's `process_audio` cuts a clip into 30 s pieces and runs Whisper's feature extractor
on each piece padded with zeros to 30 s (`padding="max_length"`): the floor is (peak - 8) over
all 3000 frames of the padded piece, and the frames kept are those of the real samples,
ceil(n / 160) of them. Every sample counts: the last frames' windows reach into the zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from backends.models.whisper_mel import (
    HOP_LENGTH, SAMPLE_RATE, WhisperMel, normalize_log_mel, num_frames, whisper_floor,
)

PIECE_SAMPLES = 30 * SAMPLE_RATE  # the processor's max_duration_seconds


def reference_pieces(clip: torch.Tensor) -> list[torch.Tensor]:
    """[n] float32 -> the 30 s pieces the processor encodes one by one (the last shorter)."""
    return list(clip.split(PIECE_SAMPLES)) if clip.shape[0] else []


def reference_mel(mel: WhisperMel, piece: torch.Tensor) -> torch.Tensor:
    """One piece ([n <= 480000] float32) -> [NUM_MEL_BINS, ceil(n / 160)] float32."""
    num = piece.shape[0]
    if not 0 < num <= PIECE_SAMPLES:
        raise ValueError(f"a reference piece holds 1 to {PIECE_SAMPLES} samples, got {num}")
    padded = F.pad(piece, (0, PIECE_SAMPLES - num))
    raw = mel.raw_frames(padded, 0, num_frames(PIECE_SAMPLES))
    return normalize_log_mel(raw, whisper_floor(raw))[:, : -(-num // HOP_LENGTH)]


def reference_rows(num_samples: int, pool_step: int = 5) -> int:
    """Prompt rows of a piece of `num_samples`: conv stride 2, then the pool of `pool_step`."""
    encoder_frames = (-(-num_samples // HOP_LENGTH) - 1) // 2 + 1
    return (encoder_frames - pool_step) // pool_step + 1 if encoder_frames >= pool_step else 0
