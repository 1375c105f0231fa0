"""The native duplex listen/speak sampling policy of the Thinker
(docs/model_facts.md#listen-or-speak-the-duplex-policy): the official duplex decoder's rules
(`MiniCPMODuplex.streaming_generate` and its `StreamDecoder.decode`).

One `DuplexPolicy` per session, installed as the runner's `SamplingHook` for the session's
request. The runner must be configured without its own repetition penalty: the boundary draw
(rule 4) reads the raw, untempered logits, and the policy applies the penalty itself after it.
Per sampled token, in order:

1. force-listen pre-pass (once per append): `force_listen` (the session's first
   `force_listen_count` units) -> `<|listen|>`; with the `listen_when_silent` option also a
   non-speech unit while no turn is open and no user speech awaits an answer;
2. async lookahead guard: the unit already ended on a chunk terminator -> re-emit it, no state
   change;
3. hard cut: max_new_speak_tokens_per_chunk - 1 tokens already in this unit -> `<|chunk_eos|>`;
4. boundary draw from the raw softmax (greedy: its argmax) -> `<|chunk_eos|>` if drawn;
5. mask tts_pad / the tokenizer's bad_token_ids / chunk_eos, repetition penalty (each distinct
   id of the last `text_repetition_window_size` decoded tokens divided by the penalty), the
   turn_eos length penalty (1.1), the listen scale on the tokenizer's EOS id, temperature,
   top-k, top-p, draw (noise keyed on the request seed and the stream position:
   backends/runner/host_draws.py); the decoded token joins the penalty window;
6. with the `max_chars_per_unit` option: a cut of the unit's text -> `<|chunk_eos|>`; with the
   `max_reply_tokens` option, checked before rule 3: a turn that has that many text tokens ->
   `<|turn_eos|>`, then `<|chunk_eos|>`;
7. `<|listen|>` while a turn is open (and not forced) -> `<|tts_bos|>`;
8. latches updated from the final token (`after_sample`).

The runner hands the policy either the whole host row (`before_sample`) or, on the fast path,
a summary of it (`before_sample_compact`: top candidates, logsumexp, probe values); both go
through the same rules on a `policy_rows.PolicyRow` and draw the same tokens.

Policy knobs for random weights (docs/duplex_contract.md#reply-shape-knobs) are options of this
same policy: with `reply_units` set, a turn that is open gets speak units of exactly
`reply_tokens_per_unit` text tokens (the last unit adds `<|turn_eos|>`), and no turn open means
`<|listen|>`. Since random weights never open a turn, the knob opens one itself where the real
model would decide: at the first non-speech unit after user speech (or at once with
`initial_user_text`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from backends.runner.host_draws import DrawRequest, DrawSteps, run_alone
from backends.runner.host_rows import CompactRow
from backends.runner.sampler import step_seed
from backends.runner.types import SampleContext
from backends.thinker.policy_config import PENALTY_WINDOW, PolicyConfig
from backends.thinker.policy_masks import PolicyIds, special_token_ids  # noqa: F401 (re-export)
from backends.thinker.policy_rows import PolicyRow, SummaryRow, WholeRow
from backends.thinker.recent_tokens import RecentTokens

if TYPE_CHECKING:
    from backends.checkpoint.tokenizer import SpecialTokens

class TextDecoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(slots=True)
class TurnLatches:
    """Session state the policy reads and writes (rule 8 of
    docs/model_facts.md#listen-or-speak-the-duplex-policy)."""

    turn_open: bool = False
    pending_speech_context: bool = False  # user speech (or initial text) awaits an answer
    pending_terminator: int | None = None  # re-injected at the head of the next append
    reply_tokens: int = 0  # text tokens of the open turn (the max_reply_tokens option)
    history: RecentTokens = field(default_factory=lambda: RecentTokens(PENALTY_WINDOW))


@dataclass(slots=True)
class _UnitState:
    force_listen: bool = False
    tokens: list[int] = field(default_factory=list)  # accepted tokens of this unit, in order
    guard_hit: bool = False  # the pending sample is a lookahead re-emit: change no state
    decoded: int | None = None  # the pending sample's rule-5 draw (joins the penalty window)
    turn_ended: bool = False  # max_reply_tokens ended the turn in this unit: the unit ends next


class DuplexPolicy:
    """The runner SamplingHook of one session."""

    def __init__(
        self,
        special: SpecialTokens,
        tokenizer: TextDecoder,
        config: PolicyConfig,
        bad_token_ids: Iterable[int] = (),
        extra_special_ids: Iterable[int] = (),
        seed: int = 0,
        ids: PolicyIds | None = None,  # the engine's, shared by its sessions; else built here
        eos_id: int | None = None,  # the tokenizer's EOS id (the listen scale's target)
    ) -> None:
        self.special = special
        self.seed = seed  # the request's; reseeds the draws once positions are shifted
        # RoPE positions repeat after a context-window cut or re-prefill; draws are seeded from
        # position + this offset so the session's random stream never repeats.
        self.position_offset = 0
        self.tokenizer = tokenizer
        self.config = config
        self.latches = TurnLatches(history=RecentTokens(config.penalty_window))
        self.terminators = frozenset((special.listen, special.chunk_eos, special.chunk_tts_eos))
        # The official decoder scales the logit of the tokenizer's EOS id (its `listen_id`),
        # <|im_end|> in the released tokenizer, not <|listen|>'s.
        self.listen_scale_id = eos_id if eos_id is not None else special.listen
        self.ids = ids or PolicyIds(special, bad_token_ids, extra_special_ids)
        self.special_ids = self.ids.special_ids
        self.reply_units_done = 0  # speak units finished in the current forced reply
        self._unit = _UnitState()

    @property
    def unit_tokens(self) -> list[int]:
        return list(self._unit.tokens)

    def open_turn_with_text(self) -> None:
        """`initial_user_text`: the turn starts open with a pending question to answer."""
        self.latches.turn_open = True
        self.latches.pending_speech_context = True
        self.latches.reply_tokens = 0
        self.reply_units_done = 0

    def begin_unit(self, force_listen: bool, speech: Sequence[bool]) -> None:
        """Called before the decision of each append; `speech`: per unit of the append, whether
        it holds speech. The decision is taken after the append's last unit."""
        latches = self.latches
        if any(speech):
            latches.pending_speech_context = True
        is_speech = bool(speech) and speech[-1]
        if not is_speech and self._knob_opens_turn(force_listen):
            latches.turn_open = True
            self.reply_units_done = 0
        silent_idle = self.config.listen_when_silent and not (
            is_speech or latches.turn_open or latches.pending_speech_context
        )
        self._unit = _UnitState(force_listen=force_listen or silent_idle)

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        return run_alone(self._decide(WholeRow(logits, self.ids, ctx.candidates), ctx))

    def before_sample_compact(self, row: CompactRow, ctx: SampleContext) -> int | None:
        """The same decision from the runner's summary of the raw row (`policy_rows`)."""
        return run_alone(self.decide_compact(row, ctx))

    def decide_compact(self, row: CompactRow, ctx: SampleContext) -> DrawSteps:
        """`before_sample_compact` as steps: the rule-5 draw is yielded (a `DrawRequest`), so
        the runner can make a step's draws together (`host_draws.run_together`)."""
        return (yield from self._decide(SummaryRow(row, self.ids), ctx))

    def _decide(self, row: PolicyRow, ctx: SampleContext) -> DrawSteps:
        unit = self._unit
        if unit.force_listen and not unit.tokens:
            return self.special.listen
        if unit.tokens and unit.tokens[-1] in self.terminators:
            unit.guard_hit = True
            return unit.tokens[-1]
        if self.config.has_reply_knobs:
            return (yield from self._reply_token(row, ctx))
        ending = self._reply_budget_token()
        if ending is not None:
            return ending
        if len(unit.tokens) >= self.config.max_tokens_per_unit - 1:
            return self.special.chunk_eos
        greedy = self.config.temperature == 0.0
        if row.boundary_hit(self.special.chunk_eos, greedy, self._step_seed(ctx)):
            return self.special.chunk_eos
        row.mask("chunk_eos_ids")
        candidate = yield from self._sample(row, ctx)
        unit.decoded = candidate
        if self._reaches_char_limit(candidate):
            return self.special.chunk_eos
        if candidate == self.special.listen and self.latches.turn_open:
            return self.special.tts_bos
        return candidate

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        unit = self._unit
        if unit.guard_hit:
            unit.guard_hit = False
            return token
        unit.tokens.append(token)
        if unit.decoded is not None:  # the official window holds the decoder's own draws
            self.latches.history.append(unit.decoded)
            unit.decoded = None
        self._update_latches(token)
        return token

    def _update_latches(self, token: int) -> None:
        latches, sp = self.latches, self.special
        if token in self.terminators:
            latches.pending_terminator = token
            if token == sp.listen and self._unit.force_listen:
                latches.turn_open, latches.reply_tokens = False, 0
            elif token != sp.listen and self.config.has_reply_knobs:
                self.reply_units_done += 1
        elif token == sp.turn_eos:
            latches.turn_open, latches.reply_tokens = False, 0
        else:
            latches.turn_open = True
            if token not in self.special_ids:
                latches.pending_speech_context = False
                latches.reply_tokens += 1

    def _reply_budget_token(self) -> int | None:
        """The `max_reply_tokens` option: once the open turn holds that many text tokens, the
        unit (opened by `<|speak|>` if this is its first token) takes `<|turn_eos|>` and then
        `<|chunk_eos|>`; where only the terminator still fits, the hard cut ends the unit and
        the next one ends the turn."""
        unit, sp = self._unit, self.special
        if unit.turn_ended:
            return sp.chunk_eos
        budget = self.config.max_reply_tokens
        if not budget or not self.latches.turn_open or self.latches.reply_tokens < budget:
            return None
        if not unit.tokens:
            return sp.speak
        if len(unit.tokens) < self.config.max_tokens_per_unit - 1:
            unit.turn_ended = True
            return sp.turn_eos
        return None

    def _knob_opens_turn(self, force_listen: bool) -> bool:
        latches = self.latches
        return (
            self.config.has_reply_knobs
            and not force_listen
            and not latches.turn_open
            and latches.pending_speech_context
        )

    def _reply_token(self, row: PolicyRow, ctx: SampleContext) -> DrawSteps:
        sp, num_text = self.special, self.config.reply_tokens_per_unit
        index = len(self._unit.tokens)
        if not self.latches.turn_open and index == 0:
            return sp.listen
        if index == 0:
            return sp.speak
        if index <= num_text:
            row.mask("special_ids")
            self._unit.decoded = yield from self._sample(row, ctx)
            return self._unit.decoded
        is_last_unit = self.reply_units_done + 1 >= self.config.reply_units
        if index == num_text + 1 and is_last_unit:
            return sp.turn_eos
        return sp.chunk_eos

    def _sample(self, row: PolicyRow, ctx: SampleContext) -> DrawSteps:
        """Rule 5 after the chunk_eos mask, in the official order: bad ids, repetition
        penalty, turn_eos length penalty, listen scale, temperature/top-k/top-p, draw (yielded
        where the row leaves its last part to the caller)."""
        row.mask("bad_ids")
        cfg = self.config
        row.penalise(self.latches.history, cfg.repetition_penalty)
        if cfg.length_penalty != 1.0:
            row.change(self.special.turn_eos, "length", cfg.length_penalty)
        if cfg.listen_prob_scale != 1.0:
            row.change(self.listen_scale_id, "scale", cfg.listen_prob_scale)
        seed = self._step_seed(ctx)
        drawn = row.draw(cfg.temperature, cfg.top_k, cfg.top_p, seed)
        return (yield drawn) if isinstance(drawn, DrawRequest) else drawn

    def _step_seed(self, ctx: SampleContext) -> int:
        """The draws' key: RoPE positions repeat after a context-window cut or re-prefill, so
        they are keyed on the stream position (position + offset), which never repeats."""
        return step_seed(self.seed, ctx.position + self.position_offset)

    def _reaches_char_limit(self, candidate: int) -> bool:
        """Rule 6: the unit's text since the last turn_eos plus a non-special candidate."""
        if not self.config.max_chars_per_unit or candidate in self.special_ids:
            return False
        tokens = self._unit.tokens
        cut = max((i + 1 for i, t in enumerate(tokens) if t == self.special.turn_eos), default=0)
        text_ids = [t for t in tokens[cut:] if t not in self.special_ids] + [candidate]
        return len(self.tokenizer.decode(text_ids)) >= self.config.max_chars_per_unit
