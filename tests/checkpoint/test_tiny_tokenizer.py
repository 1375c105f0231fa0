"""Tests for backends/checkpoint/tiny_tokenizer.py.

Strategy: train twice and compare the serialised tokenizers byte for byte; check the Qwen-like
layout (byte-level BPE first, special tokens after it) and that transformers can load the
written tokenizer directory as a fast tokenizer with the same ids.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from backends.checkpoint.tiny_tokenizer import (
    AUDIO_BOS_TOKEN, EOS_TOKEN, TEXT_EOS_TOKEN, TINY_VOCAB_SIZE, special_token_strings,
    train_tiny_tokenizer,
)
from backends.checkpoint.tokenizer import SpecialTokens


def test_training_is_deterministic_and_sized() -> None:
    first, second = train_tiny_tokenizer(), train_tiny_tokenizer()
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size(with_added_tokens=True) == TINY_VOCAB_SIZE


def test_special_tokens_follow_the_bpe_vocabulary() -> None:
    tokenizer = train_tiny_tokenizer()
    specials = special_token_strings()
    first = TINY_VOCAB_SIZE - len(specials)
    assert [tokenizer.token_to_id(t) for t in specials] == list(range(first, TINY_VOCAB_SIZE))
    assert set(SpecialTokens.token_strings().values()) <= set(specials)
    assert {EOS_TOKEN, AUDIO_BOS_TOKEN, TEXT_EOS_TOKEN} <= set(specials)
    assert len(tokenizer.encode("the weather").ids) <= 3  # merges learned from the corpus


def test_transformers_reads_the_written_directory(tiny_dir: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(tiny_dir))
    ours = train_tiny_tokenizer()
    text = "<|im_start|>Hello there<unit><|speak|>"
    assert hf(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
    assert hf.eos_token == EOS_TOKEN
