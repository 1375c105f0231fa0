"""The flow: speech codes -> 80-bin mel at 2 frames per code, conditioned on a speaker.

Keeps the reference wrapper's names (`input_embedding`, `encoder`, `encoder_proj`,
`spk_embed_affine_layer`, token2wav_facts.md 1.3). Simplification (fidelity is a later issue):
the CFM decoder with its DiT estimator is not implemented; the mel is the encoder projection
`mu` plus the projected, L2-normalised speaker embedding broadcast over time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.config import FlowConfig
from backends.models.token2wav.encoder import EncoderCache, UpsampleConformerEncoder


class CausalMaskedDiffWithXvec(nn.Module):
    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        self.encoder = UpsampleConformerEncoder(config.input_size, config.encoder)
        self.encoder_proj = nn.Linear(config.encoder.output_size, config.output_size)

    def new_cache(self, device: torch.device) -> EncoderCache:
        return self.encoder.new_cache(device)

    def inference_chunk(
        self,
        codes: torch.Tensor,  # [B, N_max] int64, any value in 0..vocab-1 past a row's codes
        num_codes: list[int],
        last_chunk: list[bool],
        speakers: torch.Tensor,  # [B, spk_embed_dim] float32
        caches: list[EncoderCache],
    ) -> tuple[torch.Tensor, list[int], list[EncoderCache]]:
        """-> (mel [B, 80, T_max] float32, valid mel frames per row, new caches)."""
        features, mel_frames, new_caches = self.encoder.forward_chunk(
            self.input_embedding(codes), num_codes, last_chunk, caches
        )
        speaker = self.spk_embed_affine_layer(F.normalize(speakers, dim=1))
        mel = self.encoder_proj(features) + speaker[:, None, :]
        return mel.transpose(1, 2), mel_frames, new_caches
