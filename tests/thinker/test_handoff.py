"""Handoff slicing and hidden-row lookup (docs/model_facts.md#thinker-to-talker-handoff;
docs/architecture.md edge cases 2 and 3).

Strategy: literal token segments for every slice rule with the expected slice written out;
hidden rows recorded in a real HiddenLedger with distinct values per (token, position), so a
row taken from the wrong place (e.g. counted from the tail) cannot match.
"""

from __future__ import annotations

import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.runner.hidden_ledger import HiddenLedger
from backends.thinker.handoff import PromptSnapshot, build_handoff, locate_rows, slice_segment

HIDDEN = 4
A, B, C = 300, 301, 302  # plain text ids of the tiny tokenizer


def _slice(segment, special, tail=None) -> tuple[list[int], bool, bool]:
    spec = slice_segment(segment, tail, special)
    return list(segment[spec.start : spec.end]), spec.turn_end, spec.segment_end


def _row(token: int, position: int) -> torch.Tensor:
    return torch.full((1, HIDDEN), float(token * 1000 + position))


def _record(ledger: HiddenLedger, tokens: list[int], first_position: int) -> None:
    for offset, token in enumerate(tokens):
        ledger.record([token], [first_position + offset], _row(token, first_position + offset))


def test_speak_unit(special: SpecialTokens) -> None:
    segment = [special.speak, A, B, special.chunk_eos]
    assert _slice(segment, special) == ([A, B], False, True)


def test_tts_bos_decision_is_not_handed(special: SpecialTokens) -> None:
    assert _slice([special.tts_bos, A, special.chunk_eos], special) == ([A], False, True)


def test_tts_bos_inside_the_segment_starts_the_slice(special: SpecialTokens) -> None:
    segment = [special.speak, special.tts_bos, A, B, special.chunk_tts_eos]
    assert _slice(segment, special) == ([A, B], False, True)


def test_first_text_token_is_the_decision(special: SpecialTokens) -> None:
    assert _slice([A, B, C, special.chunk_eos], special) == ([B, C], False, True)


def test_tts_bos_ending_the_prompt_hands_the_first_token(special: SpecialTokens) -> None:
    segment = [A, B, special.chunk_eos]
    assert _slice(segment, special, tail=special.tts_bos) == ([A, B], False, True)


def test_leading_listens_are_skipped(special: SpecialTokens) -> None:
    segment = [special.listen, special.listen, special.speak, A, special.chunk_eos]
    assert _slice(segment, special) == ([A], False, True)


def test_turn_eos_is_included_and_the_rest_dropped(special: SpecialTokens) -> None:
    segment = [special.speak, A, special.turn_eos, B, special.chunk_eos]
    assert _slice(segment, special) == ([A, special.turn_eos], True, True)


@pytest.mark.parametrize("name", ["tts_eos", "tts_pad", "unit", "unit_end"])
def test_slice_ends_before_a_boundary(special: SpecialTokens, name: str) -> None:
    segment = [special.speak, A, getattr(special, name), B, special.chunk_eos]
    assert _slice(segment, special) == ([A], False, False)


def test_listen_unit_hands_nothing(special: SpecialTokens) -> None:
    assert _slice([special.listen], special) == ([], False, False)


def test_partial_segment_never_ends_the_segment(special: SpecialTokens) -> None:
    """Edge case 3: without a terminator sampled in this segment, nothing closes it."""
    assert _slice([special.speak, A, B], special) == ([A, B], False, False)


def test_earlier_turn_eos_never_closes_a_later_segment(
    special: SpecialTokens, tokenizer: TextTokenizer
) -> None:
    """Edge case 3: unit 1 ended the turn; unit 2 (still decoding, then finished) must carry
    neither turn_end nor a segment end it did not sample, though the ledger holds unit 1."""
    ledger, snapshot = HiddenLedger(HIDDEN, 64), PromptSnapshot()
    snapshot.update([special.unit_end, special.unit])
    first = [special.speak, A, special.turn_eos, special.chunk_eos]
    _record(ledger, first[:-1], 50)
    done = build_handoff(first, snapshot, ledger, tokenizer, special, turn_start=True)
    assert done.turn_end and done.segment_end
    later = [special.speak, B, C]
    _record(ledger, later, 70)
    running = build_handoff(later, snapshot, ledger, tokenizer, special, turn_start=False)
    assert not running.turn_end and not running.segment_end
    finished = build_handoff(
        [*later, special.chunk_eos], snapshot, ledger, tokenizer, special, turn_start=False
    )
    assert not finished.turn_end and finished.segment_end


def test_hidden_rows_are_the_rows_fed_by_each_handed_token(
    special: SpecialTokens, tokenizer: TextTokenizer
) -> None:
    ledger, snapshot = HiddenLedger(HIDDEN, 64), PromptSnapshot()
    snapshot.update([special.unit])
    segment = [special.speak, A, B, special.turn_eos, special.chunk_eos]
    _record(ledger, segment[:-1], 40)  # the terminator is never forwarded
    _record(ledger, [special.chunk_eos, special.unit_end, special.unit], 44)  # next append
    handoff = build_handoff(segment, snapshot, ledger, tokenizer, special, turn_start=True)
    assert handoff.token_ids == (A, B, special.turn_eos)
    expected = torch.cat([_row(A, 41), _row(B, 42), _row(special.turn_eos, 43)])
    torch.testing.assert_close(handoff.hidden, expected, rtol=0, atol=0)
    assert handoff.hidden.dtype == torch.float32
    assert handoff.text == tokenizer.decode([A, B]) and handoff.turn_start


def test_latest_consecutive_occurrence_wins(special: SpecialTokens) -> None:
    ledger = HiddenLedger(HIDDEN, 64)
    segment = [special.speak, A, special.chunk_eos]
    _record(ledger, segment[:-1], 10)
    _record(ledger, segment[:-1], 30)
    ledger.record([special.speak, A], [60, 62], torch.zeros(2, HIDDEN))  # not consecutive
    rows = locate_rows(segment, ledger, special)
    torch.testing.assert_close(rows, torch.cat([_row(special.speak, 30), _row(A, 31)]))


def test_missing_rows_raise(special: SpecialTokens) -> None:
    with pytest.raises(LookupError, match="never captured"):
        locate_rows([special.speak, A, special.chunk_eos], HiddenLedger(HIDDEN, 8), special)


def test_empty_handoff_has_no_rows(special: SpecialTokens, tokenizer: TextTokenizer) -> None:
    handoff = build_handoff(
        [special.listen], PromptSnapshot(), HiddenLedger(HIDDEN, 8), tokenizer, special, False
    )
    assert handoff.is_empty and handoff.hidden.shape == (0, HIDDEN) and handoff.text == ""


def test_snapshot_is_replaced_and_a_missing_one_changes_nothing(special: SpecialTokens) -> None:
    """Edge case 2: in a mixed step one session appends (a snapshot) while another decodes
    (None). The decoding session keeps its last real snapshot - never cleared, never
    concatenated - and its handoff still finds the <|tts_bos|> that ended it."""
    appending, decoding = PromptSnapshot(), PromptSnapshot()
    decoding.update([special.unit, special.tts_bos])
    appending.update([special.unit, A])
    appending.update([special.chunk_eos, special.unit_end, special.unit])
    decoding.update(None)
    assert appending.token_ids == (special.chunk_eos, special.unit_end, special.unit)
    assert decoding.token_ids == (special.unit, special.tts_bos)
    spec = slice_segment([A, B, special.chunk_eos], decoding.tail, special)
    assert (spec.start, spec.end) == (0, 2)
    with pytest.raises(ValueError, match="cannot be empty"):
        decoding.update([])
