"""Shared fixtures of the audio tests: the tiny audio tower with seeded random weights
(d_model 64, 2 layers, 4 heads, ffn 256, 80 mels, 1500 positions, LLM hidden 48)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.models.whisper_encoder import WhisperEncoderConfig

TINY_ENCODER = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                    encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=1500)
TINY_LLM_HIDDEN = 48


def _build(seed: int) -> AudioEncoderModel:
    # fork_rng: seeding must not disturb other tests' global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AudioEncoderModel.from_config(TINY_ENCODER, TINY_LLM_HIDDEN)


@pytest.fixture(scope="module")
def make_tiny_model() -> Callable[[int], AudioEncoderModel]:
    return _build


@pytest.fixture(scope="module")
def tiny_model() -> AudioEncoderModel:
    return _build(0)
