"""The per-session transcript stream: characters split across units come out whole."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.checkpoint.tokenizer import TextTokenizer
from backends.thinker.text_stream import REPLACEMENT, TranscriptStream

TEXT = "café, 你好 🙂 naïve — ok"


def _split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(ids))), len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def test_per_unit_decoding_alone_shows_replacement_characters(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode(TEXT)
    # The premise: the tiny byte-level BPE splits some character across tokens.
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=12))
def test_units_join_to_the_whole_text_without_replacements(tokenizer: TextTokenizer, cuts: list[int]) -> None:
    ids = tokenizer.encode(TEXT)
    stream = TranscriptStream(tokenizer)
    units = _split(ids, cuts)
    pieces = [stream.push(unit, flush=index == len(units) - 1) for index, unit in enumerate(units)]
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in piece for piece in pieces)


def test_turn_end_flushes_an_incomplete_character(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1, "the emoji must span several byte tokens for this test"
    stream = TranscriptStream(tokenizer)
    assert stream.push(ids[:1]) == ""
    assert stream.push([], flush=True) == tokenizer.decode(ids[:1])  # nothing is kept past a turn


def test_a_genuine_replacement_character_does_not_stall_the_stream(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("a\ufffd")
    stream = TranscriptStream(tokenizer)
    out = [stream.push([i]) for i in ids] + [stream.push(tokenizer.encode("bcdefgh"))]
    assert "".join(out) == "a\ufffdbcdefgh"


@pytest.mark.parametrize("flush", [False, True])
def test_empty_push_with_nothing_held_is_empty(tokenizer: TextTokenizer, flush: bool) -> None:
    assert TranscriptStream(tokenizer).push([], flush=flush) == ""
