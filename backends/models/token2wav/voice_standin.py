"""Stand-ins for the S3 tokenizer and campplus, for checkpoints without their ONNX files.

Random-weight checkpoints (the tiny one, the full-random profile) have no trained tokenizer or
speaker model, so a voice's codes and speaker come from deterministic functions of the clip:
- codes: the 16 kHz Whisper log-mel of the clip cut or zero-padded to the prompt length,
  averaged to 25 Hz, centred per utterance, hashed by 13 seeded random hyperplanes into a
  13-bit number taken modulo the code count;
- speaker: a seeded random projection of the per-bin mean and standard deviation of that
  log-mel (the flow only uses its direction).
They follow the voice (different clips give different codes and speakers) but are not the
official model's: with real flow weights they would give the wrong voice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.models.token2wav.voice import SAMPLES_PER_CODE, fit
from backends.models.whisper_mel import WhisperMel

_WHISPER_FRAMES_PER_CODE = 4  # 100 Hz Whisper frames per 25 Hz code
_HASH_BITS = 13  # 2^13 = 8192 >= 6561 codes
_STANDIN_SEED = 20240607  # fixed: the stand-ins are part of the model, not of a run


@dataclass(frozen=True, slots=True)
class StandinVoiceEncoder:
    vocab_size: int
    spk_embed_dim: int
    description: str = "deterministic stand-ins for the S3 tokenizer and campplus"

    def encode(self, audio_16k: torch.Tensor, num_codes: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = _code_rate_features(fit(audio_16k, num_codes * SAMPLES_PER_CODE))
        return _standin_codes(features, self.vocab_size), _standin_speaker(features, self.spk_embed_dim)


def _code_rate_features(audio_16k: torch.Tensor) -> torch.Tensor:
    """-> [num_codes, 80] float32: Whisper log-mel averaged over each code's 4 frames."""
    mel = WhisperMel().spectrogram(audio_16k)  # [80, 4 num_codes]
    return mel.T.reshape(-1, _WHISPER_FRAMES_PER_CODE, mel.shape[0]).mean(dim=1)


def _standin_codes(features: torch.Tensor, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_STANDIN_SEED)
    planes = torch.randn(features.shape[1], _HASH_BITS, generator=generator)
    bits = ((features - features.mean(dim=0)) @ planes > 0).long()  # [num_codes, 13]
    value = (bits * (2 ** torch.arange(_HASH_BITS))).sum(dim=1)
    return value % vocab_size


def _standin_speaker(features: torch.Tensor, spk_embed_dim: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_STANDIN_SEED + 1)
    stats = torch.cat([features.mean(dim=0), features.std(dim=0)])
    projection = torch.randn(spk_embed_dim, stats.shape[0], generator=generator)
    return projection @ stats
