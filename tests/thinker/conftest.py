"""Shared fixtures of the Thinker tests: the tiny checkpoint's real tokenizer and its ids."""

from __future__ import annotations

import pytest

from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)


@pytest.fixture(scope="session")
def special(tokenizer: TextTokenizer) -> SpecialTokens:
    return SpecialTokens.resolve(tokenizer)
