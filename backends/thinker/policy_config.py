"""The duplex decoding settings of a session: the official duplex decoder's (defaults as the
official DuplexConfig and `streaming_generate`), then options the official code lacks, off by
default (docs/duplex_contract.md lists each and where it comes from)."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_TEMPERATURE = 0.7
MAX_TOKENS_PER_UNIT = 20  # the official max_new_speak_tokens_per_chunk
# The most a session may ask: a unit's forwarded rows stay well inside the hidden ledger (64
# rows) that its handoff reads.
TOKENS_PER_UNIT_LIMIT = 32
PENALTY_WINDOW = 512  # the official text_repetition_window_size
TURN_EOS_LENGTH_PENALTY = 1.1  # the official decoder's length_penalty on <|turn_eos|>
# A forced reply unit is <|speak|> + text + [<|turn_eos|>] + <|chunk_eos|>: 3 non-text slots.
REPLY_CONTROL_SLOTS = 3


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The official duplex decoding settings (defaults as the official DuplexConfig and
    `streaming_generate`), then options the official code lacks, off by default."""

    temperature: float = DEFAULT_TEMPERATURE  # 0 -> greedy (the official decode_mode "greedy")
    top_k: int = 20
    top_p: float = 0.8
    repetition_penalty: float = 1.05  # text_repetition_penalty
    penalty_window: int = PENALTY_WINDOW  # text_repetition_window_size
    max_tokens_per_unit: int = MAX_TOKENS_PER_UNIT  # max_new_speak_tokens_per_chunk
    listen_prob_scale: float = 1.0
    length_penalty: float = TURN_EOS_LENGTH_PENALTY
    max_chars_per_unit: int = 0  # option: cut a unit's text at this many characters (0 = off)
    listen_when_silent: bool = False  # option: listen on a non-speech unit with nothing to answer
    max_reply_tokens: int = 0  # option: a reply ends (<|turn_eos|>) after this many text tokens (0 = off)
    reply_units: int = 0  # knob: force replies of this many speak units (0 = off)
    reply_tokens_per_unit: int = 0  # knob: text tokens per forced speak unit

    def __post_init__(self) -> None:
        factors = (self.temperature, self.top_p, self.repetition_penalty, self.listen_prob_scale,
                   self.length_penalty)
        if not all(math.isfinite(value) for value in factors):
            raise ValueError(f"decoding settings must be finite, got {factors}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 1 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"need top_k >= 1 and top_p in (0, 1], got {self.top_k}, {self.top_p}")
        if not self.repetition_penalty > 0.0 or self.penalty_window < 1:
            raise ValueError(
                f"bad repetition penalty {self.repetition_penalty} / window {self.penalty_window}"
            )
        if not (self.listen_prob_scale > 0.0 and self.length_penalty > 0.0):
            raise ValueError(f"listen_prob_scale and length_penalty must be > 0, got "
                             f"{self.listen_prob_scale}, {self.length_penalty}")
        if not 2 <= self.max_tokens_per_unit <= TOKENS_PER_UNIT_LIMIT or min(self.max_chars_per_unit,
                                                                            self.max_reply_tokens) < 0:
            raise ValueError(
                f"max_tokens_per_unit must be in [2, {TOKENS_PER_UNIT_LIMIT}], max_chars_per_unit and "
                f"max_reply_tokens >= 0, got {self.max_tokens_per_unit}, {self.max_chars_per_unit}, "
                f"{self.max_reply_tokens}"
            )
        self._check_reply_knobs()

    def _check_reply_knobs(self) -> None:
        if (self.reply_units > 0) != (self.reply_tokens_per_unit > 0):
            raise ValueError(
                "reply_units and reply_tokens_per_unit are set together, got "
                f"{self.reply_units} and {self.reply_tokens_per_unit}"
            )
        limit = self.max_tokens_per_unit - REPLY_CONTROL_SLOTS
        if self.reply_units < 0 or not 0 <= self.reply_tokens_per_unit <= limit:
            raise ValueError(
                f"reply_units must be >= 0 and reply_tokens_per_unit in [0, {limit}], got "
                f"{self.reply_units} and {self.reply_tokens_per_unit}"
            )

    @property
    def has_reply_knobs(self) -> bool:
        return self.reply_units > 0
