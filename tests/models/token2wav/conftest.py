"""Shared fixtures for the token2wav tests: one tiny random-weight model and its default voice,
and the reference implementation (PyPI `stepaudio2-minicpmo==0.1.1`, see
`stepaudio2_reference`) paired with ours for the parity tests. The wheel is installed by
`scripts/test.sh` (`pip install --no-deps`); without it the parity tests skip and say how to
install it.
"""

from __future__ import annotations

import pytest
import torch

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.models.token2wav import Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav
from stepaudio2_reference import ReferencePair, build_pair, load_reference, missing_reason


@pytest.fixture(scope="session")
def token2wav() -> Token2Wav:
    return random_token2wav(Token2WavConfig.tiny(), seed=0)


@pytest.fixture(scope="session")
def voice(token2wav: Token2Wav) -> Voice:
    """The tiny checkpoint's synthetic default voice, prepared (6 s prompt: 300 mel frames)."""
    audio = torch.from_numpy(synthesize_reference_voice(0)).float()
    return token2wav.voice_from_audio(audio, REFERENCE_VOICE_SAMPLE_RATE)


@pytest.fixture(scope="session")
def pair() -> ReferencePair:
    """The reference flow + HiFT with random weights, and our Token2Wav loaded from them."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    return build_pair(load_reference())
