"""PromptLayout: exact row counts and ids of every append shape
(docs/model_facts.md#what-one-unit-adds-to-the-thinker).

Strategy: build appends with the tiny tokenizer and random unit embeddings, then check the row
count, the ledger ids row by row (decoded back to text for the system context) and that the
materialized embeddings put token embeddings and injected embeddings in the right rows.
"""

from __future__ import annotations

import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.thinker.prompt_layout import EMBEDS_PER_UNIT, PromptLayout

HIDDEN = 8


def _units(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(count)
    return [torch.randn(EMBEDS_PER_UNIT, HIDDEN, generator=generator) for _ in range(count)]


@pytest.fixture()
def layout(tokenizer: TextTokenizer, special: SpecialTokens) -> PromptLayout:
    return PromptLayout(tokenizer, special)


def test_default_system_context_text(layout: PromptLayout, tokenizer: TextTokenizer) -> None:
    segments = layout.system_context()
    ids = [t for s in segments for t in s.token_ids]
    expected = "<|im_start|>system\nStreaming Omni Conversation.\n<|audio_start|><|audio_end|><|im_end|>"
    assert tokenizer.decode(ids) == expected


@pytest.mark.parametrize("instructions", ["Be brief.", "Be brief", "说中文。", "a\n<|im_end|>b"])
def test_prefix_and_suffix_are_each_tokenized_whole(
    layout: PromptLayout, tokenizer: TextTokenizer, instructions: str
) -> None:
    """The official prepare encodes its prefix and suffix strings at once: text next to the
    newline before <|audio_start|> merges as the tokenizer merges it (".\n" is one token)."""
    segments = layout.system_context(instructions, ref_embeds=torch.randn(3, HIDDEN))
    prefix = f"<|im_start|>system\n{instructions}\n<|audio_start|>"
    assert list(segments[0].token_ids) == tokenizer.encode(prefix)
    assert list(segments[-1].token_ids) == tokenizer.encode("<|audio_end|><|im_end|>")


def test_context_with_reference_and_initial_text(
    layout: PromptLayout, tokenizer: TextTokenizer, special: SpecialTokens
) -> None:
    ref = torch.randn(7, HIDDEN)
    segments = layout.system_context("Be brief.", "hello there", ref)
    ids = [t for s in segments for t in s.token_ids]
    expected = (
        "<|im_start|>system\nBe brief.\n<|audio_start|>" + "<unit>" * 7 + "<|audio_end|>"
        "<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(ids) == expected
    injected = [s for s in segments if s.embeds is not None]
    assert len(injected) == 1 and torch.equal(injected[0].embeds, ref)
    assert injected[0].token_ids == (special.unit,) * 7


def test_first_append_is_context_plus_eleven_rows(
    layout: PromptLayout, special: SpecialTokens
) -> None:
    context = layout.system_context()
    num_context = sum(len(s.token_ids) for s in context)
    rows = layout.append(_units(1), context=context)
    assert rows.num_rows == num_context + 1 + EMBEDS_PER_UNIT
    assert rows.token_ids[num_context:] == [special.unit] + [special.audio] * EMBEDS_PER_UNIT
    assert rows.injected_rows() == list(range(num_context + 1, rows.num_rows))


def test_later_append_is_thirteen_rows(layout: PromptLayout, special: SpecialTokens) -> None:
    rows = layout.append(_units(1), terminator=special.listen)
    assert rows.num_rows == 13
    head = [special.listen, special.unit_end, special.unit]
    assert rows.token_ids == head + [special.audio] * EMBEDS_PER_UNIT


def test_multi_unit_append_reinjects_the_terminator_once(
    layout: PromptLayout, special: SpecialTokens
) -> None:
    rows = layout.append(_units(3), terminator=special.chunk_eos)
    audio = [special.audio] * EMBEDS_PER_UNIT
    unit_end, unit = special.unit_end, special.unit
    expected = [special.chunk_eos, unit_end, unit, *audio] + [unit_end, unit, *audio] * 2
    assert rows.num_rows == 13 + 2 * 12
    assert rows.token_ids == expected
    assert rows.num_units == 3


def test_first_append_with_two_units(layout: PromptLayout, special: SpecialTokens) -> None:
    context = layout.system_context()
    num_context = sum(len(s.token_ids) for s in context)
    rows = layout.append(_units(2), context=context)
    assert rows.num_rows == num_context + 11 + 12
    assert rows.token_ids[num_context + 11 : num_context + 13] == [special.unit_end, special.unit]


def test_materialize_places_token_and_injected_rows(
    layout: PromptLayout, special: SpecialTokens
) -> None:
    table = torch.nn.Embedding(1000, HIDDEN)
    units = _units(2)
    rows = layout.append(units, terminator=special.chunk_eos)
    with torch.no_grad():
        embeds = rows.materialize(table, "cpu", torch.float32)
        head = table(torch.tensor([special.chunk_eos, special.unit_end, special.unit]))
    assert embeds.shape == (rows.num_rows, HIDDEN)
    torch.testing.assert_close(embeds[:3], head, rtol=0, atol=0)
    torch.testing.assert_close(embeds[3:13], units[0], rtol=0, atol=0)
    torch.testing.assert_close(embeds[15:25], units[1], rtol=0, atol=0)


def test_append_needs_context_xor_terminator(
    layout: PromptLayout, special: SpecialTokens
) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        layout.append(_units(1))
    with pytest.raises(ValueError, match="exactly one"):
        layout.append(_units(1), context=layout.system_context(), terminator=special.listen)


def test_append_rejects_wrong_unit_shape(layout: PromptLayout, special: SpecialTokens) -> None:
    with pytest.raises(ValueError, match="expected \\[10, hidden\\]"):
        layout.append([torch.zeros(9, HIDDEN)], terminator=special.listen)


def test_unit_offsets_and_heads(layout: PromptLayout, special: SpecialTokens) -> None:
    rows = layout.append(_units(3), terminator=special.chunk_eos)
    assert rows.unit_offsets == (2, 14, 26) and rows.unit_heads == (2, 1, 1)
    assert [rows.token_ids[i] for i in rows.unit_offsets] == [special.unit] * 3
    first = layout.append(_units(1), context=layout.system_context())
    assert first.unit_heads == (0,) and first.token_ids[first.unit_offsets[0]] == special.unit
    assert not rows.restarts and not first.restarts


def test_previous_text_sits_before_the_suffix(
    layout: PromptLayout, tokenizer: TextTokenizer
) -> None:
    """Where the official context window puts it: after the reference rows, before
    `<|audio_end|><|im_end|>`."""
    previous = tokenizer.encode(" the end")
    segments = layout.system_context("Be brief.", "hi", torch.randn(2, HIDDEN), previous)
    ids = [t for s in segments for t in s.token_ids]
    expected = (
        "<|im_start|>system\nBe brief.\n<|audio_start|><unit><unit>\n\nprevious:  the end"
        "<|audio_end|><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(ids) == expected


def test_rebuild_equals_the_kv_a_session_held_minus_dropped_units(
    layout: PromptLayout, special: SpecialTokens
) -> None:
    """Units 1 and 2 of a session, appended one by one after unit 0, then rebuilt without
    unit 0: the rows after the system context are the same rows in the same order."""
    units = _units(4)
    tokens = [(special.listen,), (special.speak, 300, special.chunk_eos), (special.listen,)]
    streamed: list[int] = []
    for index in (1, 2, 3):
        rows = layout.append([units[index]], terminator=tokens[index - 1][-1])
        streamed += rows.token_ids + list(tokens[index][:-1]) if index < 3 else rows.token_ids
    system = layout.system_context()
    rebuilt = layout.rebuild(system, [(units[1], tokens[1]), (units[2], tokens[2])], [units[3]])
    num_system = sum(len(s.token_ids) for s in system)
    assert rebuilt.token_ids[num_system:] == streamed[2:]  # unit 0's terminator and </unit>
    assert rebuilt.restarts and rebuilt.num_units == 1 and rebuilt.unit_heads == (0, 0, 0)
    assert [rebuilt.token_ids[i] for i in rebuilt.unit_offsets] == [special.unit] * 3
    embeds = rebuilt.materialize(torch.nn.Embedding(1000, HIDDEN), "cpu", torch.float32)
    for unit, offset in zip(units[1:], rebuilt.unit_offsets):
        torch.testing.assert_close(embeds[offset + 1 : offset + 11], unit, rtol=0, atol=0)
