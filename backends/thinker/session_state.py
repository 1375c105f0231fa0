"""Everything one Thinker session (one resumable runner request) keeps between appends.

The session owns its streaming audio encoder (audio KV cache), its duplex policy (turn latches,
pending terminator, penalty history), its hidden-row ledger and prompt snapshot, its context
window (the units in KV), and the queue of appends not yet decided. The engine drives it;
nothing here touches the runner (the engine applies the window's cuts and restarts there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from backends.checkpoint.tokenizer import SpecialTokens
from backends.contracts.messages import DECISION_LISTEN, DECISION_SPEAK, ThinkerRequest
from backends.contracts.messages import ThinkerUnitResult
from backends.contracts.sink import ResponseSink
from backends.runner.hidden_ledger import HiddenLedger
from backends.runner.types import StepInput, StepResult
from backends.thinker.context_window import WINDOW_OFF, ContextWindow, WindowConfig
from backends.thinker.duplex_policy import DuplexPolicy, TextDecoder
from backends.thinker.handoff import PromptSnapshot, build_handoff
from backends.thinker.isolating_hook import IsolatingHook
from backends.thinker.prefill_chunks import PrefillCursor
from backends.thinker.text_stream import TranscriptStream
from backends.thinker.prompt_layout import UNIT_SAMPLES, AppendRows, PromptLayout, RowSegment

SPEECH_RMS = 0.003  # overlap_silence_rms upstream: a unit at or above this RMS is speech


class UnitEncoder(Protocol):
    """The per-session streaming audio encoder (backends.audio.streaming_encoder)."""

    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        """samples: [16000] float32 -> [10, llm_hidden]."""
        ...

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        """samples: [n] float32, every sample kept -> [rows, llm_hidden]."""
        ...

    def reset(self) -> None: ...


@dataclass(slots=True)
class QueuedAppend:
    request: ThinkerRequest
    sink: ResponseSink


@dataclass(slots=True)
class ActiveAppend:
    """The append being decided: its rows until prefilled, then its sampled tokens."""

    request: ThinkerRequest
    sink: ResponseSink
    rows: AppendRows | None  # None once the rows are in KV
    unit_index: int  # index of the append's last unit since the session started
    embeds: list[torch.Tensor] = field(default_factory=list)  # each [10, hidden], per new unit
    tokens: list[int] = field(default_factory=list)  # sampled for this unit, in order
    is_setup: bool = False  # a first append without audio: the system context alone, unsampled
    prefill: PrefillCursor | None = None  # the rows' progress into KV, from the first chunk on


class ThinkerSession:
    def __init__(
        self,
        request_id: str,
        encoder: UnitEncoder,
        policy: DuplexPolicy,
        layout: PromptLayout,
        tokenizer: TextDecoder,
        ledger: HiddenLedger,
        window: ContextWindow | None = None,  # default: off
        prefill_chunk_rows: int = 0,  # most prefill rows per step (backends/thinker/prefill_chunks.py)
        max_len: int = 0,  # the KV tokens the session reserved (0: unknown, tests without a runner)
    ) -> None:
        self.request_id = request_id
        self.max_len = max_len
        self.prefill_chunk_rows = prefill_chunk_rows
        self.window = window or ContextWindow(WINDOW_OFF, WindowConfig(), 1)
        self.encoder = encoder
        self.policy = policy
        self.layout = layout
        self.tokenizer = tokenizer
        self.special: SpecialTokens = layout.special
        self.ledger = ledger
        self.snapshot = PromptSnapshot()
        self.transcript = TranscriptStream(tokenizer)
        self.hook = IsolatingHook(policy, self.special.chunk_eos)
        self.queue: deque[QueuedAppend] = deque()
        self.active: ActiveAppend | None = None
        self.context: list[RowSegment] | None = None  # system rows, until the first append
        self.system_args: tuple[str, str, torch.Tensor | None] = ("", "", None)  # for rebuilds
        self.num_units = 0  # units appended since the session started
        self.last_seq = -1
        self.spoke_in_turn = False  # a non-empty handoff already went out in the open turn
        self.pending_terminator: int | None = None  # the last unit's, re-injected next append

    @property
    def has_work(self) -> bool:
        return self.active is not None or bool(self.queue)

    @property
    def decode_budget(self) -> int:
        """KV rows a unit's decode may add: its tokens but the terminator (never forwarded)."""
        return self.policy.config.max_tokens_per_unit - 1

    def setup(self, first: ThinkerRequest, default_voice: np.ndarray | None = None) -> None:
        """Session context from the first append (instructions, reference, initial text).
        Without a reference clip the Thinker hears `default_voice` (the checkpoint's default
        voice, [n] float32 16 kHz), as the official demo feeds its default clip."""
        clip = first.ref_audio
        if len(clip) == 0 and default_voice is not None:
            clip = default_voice
        ref_embeds = _reference_rows(self.encoder, clip)
        self.system_args = (first.instructions, first.initial_user_text, ref_embeds)
        self.context = self.layout.system_context(*self.system_args)
        if first.initial_user_text:
            self.policy.open_turn_with_text()

    def pending_unit(self) -> np.ndarray | None:
        """The next append's audio ([16000] float32) when it is about to activate and holds one
        unit: the engine encodes those of all sessions in one batch (backends/thinker/
        unit_batch.py) and passes the result to `activate`. None otherwise."""
        if self.active is not None or not self.queue:
            return None
        audio = self.queue[0].request.audio
        return _split_units(audio)[0] if len(audio) == UNIT_SAMPLES else None

    def activate(self, encoded: torch.Tensor | Exception | None = None) -> ActiveAppend:
        """Encode the next queued append's units and lay out its rows. `encoded`: the rows of
        its one unit ([10, hidden]) already encoded in a batch, or that encode's error."""
        queued = self.queue[0]  # popped only once laid out: a failure leaves its sink queued
        units = _split_units(queued.request.audio)
        if not units:
            return self._activate_setup(queued)
        if isinstance(encoded, Exception):
            raise encoded
        assert encoded is None or len(units) == 1, "batch-encoded rows are one unit's"
        embeds = [encoded] if encoded is not None else [self.encoder.encode_unit(u) for u in units]
        rows = self._layout(embeds)
        self.num_units += len(units)
        speech = [float(np.sqrt(np.mean(np.square(unit)))) >= SPEECH_RMS for unit in units]
        self.policy.begin_unit(queued.request.force_listen, speech)
        self.queue.popleft()
        self.active = ActiveAppend(queued.request, queued.sink, rows, self.num_units - 1, embeds)
        return self.active

    def _activate_setup(self, queued: QueuedAppend) -> ActiveAppend:
        """Seq 0 without audio: prefill the system context now, before the first unit is
        complete, so the first unit's append is 11 rows (`<unit>` + its embeddings)."""
        if self.context is None:
            raise RuntimeError(f"session {self.request_id!r}: a setup append after the first")
        rows = AppendRows(tuple(self.context), 0)
        self.context = ()  # in KV: the first unit's append adds no context
        self.queue.popleft()
        self.active = ActiveAppend(
            queued.request, queued.sink, rows, self.num_units - 1, is_setup=True
        )
        return self.active

    def _layout(self, embeds: list[torch.Tensor]) -> AppendRows:
        """The append's rows: incremental, or (a `context` window dropping units) the whole
        rebuilt prompt, which the engine prefills into a fresh KV."""
        if self.context is not None:
            rows = self.layout.append(embeds, context=self.context)
            self.context = None
            return rows
        drop = self.window.units_to_drop(len(embeds))
        if drop == 0:
            return self.layout.append(embeds, terminator=self.pending_terminator)
        self.window.drop_oldest(drop, self.policy.special_ids)
        instructions, initial_user_text, ref_embeds = self.system_args
        system = self.layout.system_context(
            instructions, initial_user_text, ref_embeds, tuple(self.window.previous)
        )
        return self.layout.rebuild(system, self.window.history(), embeds)

    def next_input(
        self,
        embed_tokens: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> StepInput:
        """The active append's rows for this step: its prefill (or its next chunk), or one
        decode row."""
        active = self._require_active()
        if active.rows is not None:
            if active.prefill is None:
                active.prefill = PrefillCursor(active.rows, self.prefill_chunk_rows)
            return active.prefill.step_input(
                self.request_id, embed_tokens, device, dtype, sample=not active.is_setup
            )
        return StepInput(self.request_id, [active.tokens[-1]], capture_hidden=True)

    def consume(self, inp: StepInput, result: StepResult) -> ThinkerUnitResult | None:
        """Take one step's result; returns the unit's result once its terminator is sampled."""
        if self.hook.error is not None:
            raise self.hook.error
        active = self._require_active()
        if active.rows is not None:
            prefill = active.prefill
            assert prefill is not None  # next_input made it
            if not prefill.advance(inp, result):
                return None  # more of the append's rows to forward first
            rows, active.rows, active.prefill = active.rows, None, None
            if active.is_setup:  # a setup answers no unit
                return None
            self.snapshot.update(rows.token_ids)
            self.window.on_prefill(prefill.first_position, rows, active.embeds)
        else:
            self.snapshot.update(None)  # a decode row carries no prompt snapshot
            self.ledger.record(inp.token_ids, result.positions, result.hidden)
        if result.token is None:
            raise RuntimeError(f"session {self.request_id!r}: the runner sampled no token")
        active.tokens.append(result.token)
        if result.token in self.special.chunk_terminators:
            return self._finish_unit(active)
        if len(active.tokens) >= self.policy.config.max_tokens_per_unit:
            raise RuntimeError(
                f"session {self.request_id!r}: unit ran {len(active.tokens)} tokens without a "
                "chunk terminator (the policy's hard cut failed)"
            )
        return None

    def close(self) -> None:
        """Drop the encoder cache and captured rows; the engine frees the runner request."""
        self.encoder.reset()
        self.ledger.clear()
        self.queue.clear()
        self.active = None

    def _finish_unit(self, active: ActiveAppend) -> ThinkerUnitResult:
        tokens = active.tokens
        # The runner's sampled terminator is canonical: it is what the KV will hold next.
        self.pending_terminator = tokens[-1]
        self.window.on_decision(tokens)
        speaks = tokens[-1] != self.special.listen and len(tokens) > 1
        # An empty handoff never reaches the Talker, so it cannot carry the turn start.
        handoff = build_handoff(
            tokens, self.snapshot, self.ledger, self.tokenizer, self.special,
            turn_start=not self.spoke_in_turn,
        )
        hands_speech = not handoff.is_empty
        self.spoke_in_turn = (self.spoke_in_turn or hands_speech) and self.policy.latches.turn_open
        return ThinkerUnitResult(
            request_id=self.request_id,
            seq=active.request.seq,
            unit_index=active.unit_index,
            decision=DECISION_SPEAK if speaks else DECISION_LISTEN,
            token_ids=np.asarray(tokens, dtype=np.int32),
            # A character split across units comes out whole with the next unit's text.
            text=self.transcript.push(handoff.text_ids, flush=handoff.turn_end or not speaks),
            tts_token_ids=np.asarray(handoff.token_ids, dtype=np.int32),
            tts_hidden=handoff.hidden.cpu().numpy().astype(np.float32, copy=False),
            turn_start=handoff.turn_start and hands_speech,
            turn_end=handoff.turn_end,
            segment_end=handoff.segment_end,
        )

    def _require_active(self) -> ActiveAppend:
        if self.active is None:
            raise RuntimeError(f"session {self.request_id!r} has no active append")
        return self.active


def _split_units(audio: np.ndarray) -> list[np.ndarray]:
    """[num_units * 16000] float32 -> num_units arrays of [16000] float32."""
    samples = np.ascontiguousarray(audio, dtype=np.float32)
    return [samples[start : start + UNIT_SAMPLES] for start in range(0, len(samples), UNIT_SAMPLES)]


def _reference_rows(encoder: UnitEncoder, ref_audio: np.ndarray) -> torch.Tensor | None:
    """The clip's prompt rows (every sample kept, as the official prompt builder does), or None
    when it gives none (no clip, or one too short for a single row)."""
    if len(ref_audio) == 0:
        return None
    rows = encoder.encode_reference(np.ascontiguousarray(ref_audio, dtype=np.float32))
    return rows if rows.shape[0] else None
