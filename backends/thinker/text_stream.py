"""Per-session incremental detokenisation of the transcript handed out unit by unit.

A byte-level BPE token can end in the middle of a UTF-8 character (CJK, emoji, accented
letters), so decoding each unit's tokens on their own can show U+FFFD where the character is
split across two units. The stream holds back the tokens of an incomplete trailing character
and decodes them together with the next unit's; a turn end flushes whatever is held.
"""
from __future__ import annotations

from collections.abc import Sequence

from backends.thinker.duplex_policy import TextDecoder

REPLACEMENT = "\ufffd"
MAX_HELD_TOKENS = 4  # a UTF-8 character has at most 4 bytes, and a byte-level token at least one


class TranscriptStream:
    def __init__(self, tokenizer: TextDecoder) -> None:
        self._tokenizer = tokenizer
        self._held: list[int] = []

    def push(self, token_ids: Sequence[int], flush: bool = False) -> str:
        """The text of `token_ids` (after what is held), minus an incomplete trailing character
        unless `flush`; what is held back comes out with a later push."""
        ids = self._held + list(token_ids)
        if not ids:
            return ""
        text = self._tokenizer.decode(ids)
        if flush or not text.endswith(REPLACEMENT):
            self._held = []
            return text
        complete = self._complete_prefix(ids)
        self._held = ids[complete:]
        return self._tokenizer.decode(ids[:complete]) if complete else ""

    def _complete_prefix(self, ids: list[int]) -> int:
        """The longest prefix of `ids` whose text does not end in U+FFFD, at most MAX_HELD_TOKENS
        tokens short of all of them (a genuine U+FFFD in the text must not stall the stream)."""
        for cut in range(len(ids) - 1, max(len(ids) - MAX_HELD_TOKENS, 0) - 1, -1):
            if cut == 0 or not self._tokenizer.decode(ids[:cut]).endswith(REPLACEMENT):
                return cut
        return len(ids)

    def reset(self) -> None:
        self._held = []
