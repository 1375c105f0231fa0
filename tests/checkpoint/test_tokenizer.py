"""Tests for backends/checkpoint/tokenizer.py.

Strategy: special tokens are checked against hand-built word-level tokenizers whose ids are
placed in unusual orders, so only a lookup by string can pass; the EOS fallback and the
"list every missing token" rule get their own tokenizers. Text round-trips are property
tests over arbitrary Unicode on the tiny checkpoint's byte-level tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer

REQUIRED = ["<unit>", "</unit>", "<|listen|>", "<|speak|>", "<|tts_bos|>", "<|tts_eos|>",
            "<|tts_pad|>", "<|chunk_eos|>", "<|chunk_tts_eos|>", "<|turn_eos|>"]


def _word_tokenizer(specials: list[str], eos: str | None = None, offset: int = 7) -> TextTokenizer:
    """Words 'hello'/'world' first, then `specials` from id `offset` on, in the given order."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.add_tokens([f"pad{i}" for i in range(offset - len(vocab))])
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return TextTokenizer(backend, eos)


def test_ids_follow_the_tokenizer_not_a_table() -> None:
    """Catches hard-coded ids: the same names resolve to reversed ids in a reversed vocabulary."""
    forward = SpecialTokens.resolve(_word_tokenizer(REQUIRED))
    backward = SpecialTokens.resolve(_word_tokenizer(REQUIRED[::-1], offset=100))
    assert (forward.unit, forward.turn_eos) == (7, 16)
    assert (backward.unit, backward.turn_eos) == (109, 100)


def test_every_field_resolves_by_its_string(tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir)
    special = SpecialTokens.resolve(tokenizer)
    for name, text in SpecialTokens.token_strings().items():
        assert getattr(special, name) == tokenizer.token_to_id(text), name
        assert tokenizer.encode(text) == [getattr(special, name)], name
    assert len(set(SpecialTokens.token_strings().values())) == 15


def test_listen_falls_back_to_eos() -> None:
    specials = [t for t in REQUIRED if t != "<|listen|>"] + ["<|endoftext|>"]
    tokenizer = _word_tokenizer(specials, eos="<|endoftext|>")
    special = SpecialTokens.resolve(tokenizer)
    assert special.listen == tokenizer.token_to_id("<|endoftext|>")
    assert special.listen in special.chunk_terminators


def test_missing_required_tokens_are_all_listed() -> None:
    tokenizer = _word_tokenizer([t for t in REQUIRED if t not in ("<|speak|>", "<|turn_eos|>", "<|listen|>")])
    with pytest.raises(ValueError, match=r"<\|listen\|>, <\|speak\|>, <\|turn_eos\|>"):
        SpecialTokens.resolve(tokenizer)


def test_optional_tokens_may_be_absent() -> None:
    special = SpecialTokens.resolve(_word_tokenizer(REQUIRED))
    assert special.audio is None and special.im_end is None
    assert special.chunk_terminators == {special.listen, special.chunk_eos, special.chunk_tts_eos}
    assert special.turn_terminators == {special.turn_eos}


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80))
def test_encode_decode_round_trips_any_text(tiny_dir: Path, text: str) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_survive_decode_unless_skipped(tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir)
    ids = tokenizer.encode("<unit>hello there<|listen|>")
    assert tokenizer.decode(ids) == "<unit>hello there<|listen|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello there"


def test_eos_comes_from_tokenizer_config(tiny_dir: Path, tmp_path: Path) -> None:
    assert TextTokenizer.from_dir(tiny_dir).eos_token == "<|endoftext|>"
    (tmp_path / "tokenizer.json").write_bytes((tiny_dir / "tokenizer.json").read_bytes())
    assert TextTokenizer.from_dir(tmp_path).eos_token_id is None  # no tokenizer_config.json
    dict_form = {"eos_token": {"content": "<|im_end|>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict_form))
    tokenizer = TextTokenizer.from_dir(tmp_path)
    assert tokenizer.eos_token_id == tokenizer.token_to_id("<|im_end|>")


def test_missing_tokenizer_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing tokenizer: .*tokenizer.json"):
        TextTokenizer.from_dir(tmp_path)
