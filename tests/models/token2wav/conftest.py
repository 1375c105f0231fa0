"""Shared fixtures for the token2wav tests: one tiny random-weight model per session."""

from __future__ import annotations

import pytest

from backends.models.token2wav import Token2Wav, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav


@pytest.fixture(scope="session")
def token2wav() -> Token2Wav:
    return random_token2wav(Token2WavConfig.tiny(), seed=0)

