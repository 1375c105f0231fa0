"""Thinker -> Talker handoff of one finished unit (docs/model_facts.md#thinker-to-talker-handoff;
edge cases 2 and 3 of docs/architecture.md#edge-cases-the-tests-hold).

The slice of a unit's sampled tokens that the Talker speaks: leading `<|listen|>` decisions
skipped, the unit's first decision token (`<|speak|>`, `<|tts_bos|>` or a first text token) not
handed, a `<|tts_bos|>` ending the prompt or inside the segment starting the slice after it; the
slice ends before the first boundary token, with `<|turn_eos|>` INCLUDED (its hidden state is the
Talker's trained stop signal) and anything after it dropped.

Only the current unit's tokens are sliced, so a terminator or `<|turn_eos|>` of an earlier unit
can never close a later segment (edge case 3). Hidden rows are located by content in the
session's ledger, never by counting back from the tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from backends.runner.hidden_ledger import HiddenLedger
from backends.thinker.duplex_policy import TextDecoder, special_token_ids

if TYPE_CHECKING:
    from backends.checkpoint.tokenizer import SpecialTokens


@dataclass(frozen=True, slots=True)
class HandoffSlice:
    start: int  # index in the segment of the first handed token
    end: int  # exclusive
    turn_end: bool  # the slice holds <|turn_eos|>
    segment_end: bool  # the segment ended on chunk_eos / chunk_tts_eos


@dataclass(frozen=True, slots=True)
class Handoff:
    token_ids: tuple[int, ...]  # handed tokens, <|turn_eos|> included
    hidden: torch.Tensor  # [m, llm_hidden] float32 row whose input was each handed token
    text: str  # transcript of the slice (special tokens left out), decoded on its own
    text_ids: tuple[int, ...]  # the slice's tokens that make the transcript (specials left out)
    turn_start: bool
    turn_end: bool
    segment_end: bool

    @property
    def is_empty(self) -> bool:
        return not self.token_ids


class PromptSnapshot:
    """A session's last real per-append prompt. An append replaces it; a decode row (which has
    no snapshot) leaves it untouched: replaced, never concatenated, never cleared (edge case 2).
    """

    def __init__(self) -> None:
        self._token_ids: tuple[int, ...] = ()

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self._token_ids

    @property
    def tail(self) -> int | None:
        return self._token_ids[-1] if self._token_ids else None

    def update(self, token_ids: Sequence[int] | None) -> None:
        if token_ids is None:
            return
        if not token_ids:
            raise ValueError("a prompt snapshot of an append cannot be empty")
        self._token_ids = tuple(token_ids)


def slice_segment(
    segment: Sequence[int], prompt_tail: int | None, special: SpecialTokens
) -> HandoffSlice:
    """Where the handed tokens sit in one unit's sampled tokens."""
    sp = special
    first = 0
    while first < len(segment) and segment[first] == sp.listen:
        first += 1
    # A prompt ending in <|tts_bos|> already opened speech: the first token is text, not a
    # decision.
    start = first if prompt_tail == sp.tts_bos else first + 1
    bos = next((i for i in range(first, len(segment)) if segment[i] == sp.tts_bos), None)
    if bos is not None:
        start = max(start, bos + 1)
    start = min(start, len(segment))
    end, turn_end = _slice_end(segment, start, sp)
    return HandoffSlice(start, end, turn_end, _ends_segment(segment, end, sp))


def build_handoff(
    segment: Sequence[int],
    snapshot: PromptSnapshot,
    ledger: HiddenLedger,
    tokenizer: TextDecoder,
    special: SpecialTokens,
    turn_start: bool,
) -> Handoff:
    """The handoff of one finished unit; `segment` = every token sampled in the unit."""
    spec = slice_segment(segment, snapshot.tail, special)
    token_ids = tuple(segment[spec.start : spec.end])
    if token_ids:
        hidden = locate_rows(segment, ledger, special)[spec.start : spec.end]
    else:
        hidden = torch.empty(0, ledger.hidden_size, dtype=torch.float32)
    specials = special_token_ids(special)
    text_ids = tuple(t for t in token_ids if t not in specials)
    text = tokenizer.decode(list(text_ids))
    return Handoff(token_ids, hidden, text, text_ids, turn_start, spec.turn_end, spec.segment_end)


def locate_rows(
    segment: Sequence[int], ledger: HiddenLedger, special: SpecialTokens
) -> torch.Tensor:
    """[k, hidden] float32 ledger rows of the segment's first k tokens: the full unit, or the
    unit minus its trailing terminator (sampled but never forwarded)."""
    candidates = [list(segment)]
    terminators = (special.listen, special.chunk_eos, special.chunk_tts_eos)
    if segment and segment[-1] in terminators:
        candidates.append(list(segment[:-1]))
    for block in candidates:
        rows = ledger.find_block(block)
        if rows is not None:
            return rows
    raise LookupError(
        f"no consecutive ledger rows hold the unit's tokens {list(segment)}: the hidden "
        "states of a handed token were never captured"
    )


def _handoff_boundaries(sp: SpecialTokens) -> frozenset[int]:
    return frozenset(
        (sp.tts_eos, sp.tts_pad, sp.listen, sp.chunk_eos, sp.chunk_tts_eos, sp.unit, sp.unit_end)
    )


def _slice_end(segment: Sequence[int], start: int, sp: SpecialTokens) -> tuple[int, bool]:
    boundaries = _handoff_boundaries(sp)
    for index in range(start, len(segment)):
        token = segment[index]
        if token == sp.turn_eos:
            return index + 1, True
        if token in boundaries:
            return index, False
    return len(segment), False


def _ends_segment(segment: Sequence[int], end: int, sp: SpecialTokens) -> bool:
    """The first boundary at or after the slice end is a chunk terminator sampled in this unit."""
    boundaries = _handoff_boundaries(sp)
    following = next((t for t in segment[end:] if t in boundaries), None)
    return following in (sp.chunk_eos, sp.chunk_tts_eos)
