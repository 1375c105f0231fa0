"""The exact rows one append adds to a session's Thinker request
(docs/model_facts.md#what-one-unit-adds-to-the-thinker).

First append: system context, then `<unit>` + 10 audio embeddings (no closing tokens before the
first unit). Later appends: the previous unit's terminator (re-injected: the listen/speak policy
depends on seeing its own past decisions), `</unit>`, `<unit>`, 10 audio embeddings = 13 rows.
Units after the first in one append get `</unit>` alone before their `<unit>`.

A unit starts at its `<unit>` row: the `context` window (docs/model_facts.md#context-window)
rebuilds a prompt as the system context (with the dropped units' text behind a "previous" marker),
then every retained unit as `<unit>` + 10 embeddings + its sampled tokens (terminator included) +
`</unit>`, then the new units: row for row what the session's KV held, minus the dropped units.

The row count is exact by construction: every row here is a real token or a real embedding, so
no padding ever reaches the KV (surplus pad rows measurably corrupt listen/speak upstream).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from backends.runner.host_staging import to_device

if TYPE_CHECKING:
    from backends.checkpoint.tokenizer import SpecialTokens

UNIT_SAMPLES = 16000  # one unit = 1 s of 16 kHz audio
EMBEDS_PER_UNIT = 10  # audio embeddings per unit (one per 100 ms)
DEFAULT_INSTRUCTIONS = "Streaming Omni Conversation."
PREVIOUS_MARKER = "\n\nprevious: "  # precedes the dropped units' text in a rebuilt context


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class RowSegment:
    """Consecutive rows: plain tokens (embedded by the model) or injected embeddings."""

    token_ids: tuple[int, ...]  # ledger id of each row (placeholder id for injected rows)
    embeds: torch.Tensor | None = None  # [len(token_ids), hidden] injected; None -> embed ids

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a RowSegment needs at least one row")
        if self.embeds is not None and (
            self.embeds.dim() != 2 or self.embeds.shape[0] != len(self.token_ids)
        ):
            raise ValueError(
                f"injected embeds {tuple(self.embeds.shape)} do not match "
                f"{len(self.token_ids)} rows"
            )


@dataclass(frozen=True, slots=True)
class AppendRows:
    """All rows of one append, in KV order."""

    segments: tuple[RowSegment, ...]
    num_units: int  # new units (the last `num_units` entries of unit_offsets)
    unit_offsets: tuple[int, ...] = ()  # row index of each laid-out unit's <unit> row
    unit_heads: tuple[int, ...] = ()  # rows before each <unit> that open it (terminator, </unit>)
    restarts: bool = False  # a rebuilt prompt: it replaces the session's whole KV

    @property
    def token_ids(self) -> list[int]:
        return [token for segment in self.segments for token in segment.token_ids]

    @property
    def num_rows(self) -> int:
        return sum(len(segment.token_ids) for segment in self.segments)

    def injected_rows(self) -> list[int]:
        """Row indices whose input is an injected embedding."""
        rows, start = [], 0
        for segment in self.segments:
            if segment.embeds is not None:
                rows.extend(range(start, start + len(segment.token_ids)))
            start += len(segment.token_ids)
        return rows

    def materialize(
        self,
        embed_tokens: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """[num_rows, hidden] `dtype` input embeddings: token rows through `embed_tokens`
        ([n] int64 -> [n, hidden]), injected rows as given."""
        parts = []
        for segment in self.segments:
            if segment.embeds is None:
                # queued without a host wait (a blocking copy waits for the step in flight)
                ids = to_device(np.asarray(segment.token_ids, dtype=np.int64), device)
                parts.append(embed_tokens(ids).to(dtype))
            else:
                parts.append(segment.embeds.to(device=device, dtype=dtype))
        return torch.cat(parts)


class PromptLayout:
    """Builds a session's rows from the special-token ids and the tokenizer."""

    def __init__(self, tokenizer: TextEncoder, special: SpecialTokens) -> None:
        if special.im_start is None or special.im_end is None:
            raise ValueError("the duplex system prompt needs <|im_start|> and <|im_end|>")
        self.tokenizer = tokenizer
        self.special = special
        # Upstream records audio rows under the scheduler placeholder <unit> when the
        # tokenizer has no <|audio|>.
        self.audio_id = special.audio if special.audio is not None else special.unit

    def system_context(
        self,
        instructions: str = "",
        initial_user_text: str = "",
        ref_embeds: torch.Tensor | None = None,  # [n, hidden] reference-voice embeddings
        previous_ids: Sequence[int] = (),
    ) -> list[RowSegment]:
        """The session prefix as the official duplex `prepare` feeds it: the whole prefix string
        `<|im_start|>system\n{instructions}\n<|audio_start|>` tokenized at once, the reference
        voice's rows, then the suffix `<|audio_end|><|im_end|>` tokenized at once. `previous_ids`
        (the `context` window's dropped text) sit behind PREVIOUS_MARKER between the reference
        rows and the suffix, where the official context window puts them. `initial_user_text`
        (an option the official duplex prompt lacks) adds a user turn after the suffix."""
        if self.special.audio_start is None or self.special.audio_end is None:
            raise ValueError("the duplex system prompt needs <|audio_start|> and <|audio_end|>")
        prefix = f"<|im_start|>system\n{instructions or DEFAULT_INSTRUCTIONS}\n<|audio_start|>"
        segments = [RowSegment(tuple(self._text(prefix)))]
        if ref_embeds is not None and ref_embeds.shape[0] > 0:
            # Reference rows are recorded as <unit> ids (the scheduler placeholder upstream).
            segments.append(RowSegment((self.special.unit,) * ref_embeds.shape[0], ref_embeds))
        ids: list[int] = []
        if previous_ids:
            ids += [*self._text(PREVIOUS_MARKER), *previous_ids]
        suffix = "<|audio_end|><|im_end|>"
        if initial_user_text:
            suffix += f"\n<|im_start|>user\n{initial_user_text}<|im_end|>\n<|im_start|>assistant\n"
        segments.append(RowSegment((*ids, *self._text(suffix))))
        return segments

    def append(
        self,
        unit_embeds: Sequence[torch.Tensor],  # each [10, hidden]
        context: Sequence[RowSegment] | None = None,
        terminator: int | None = None,
    ) -> AppendRows:
        """Rows of one append: `context` on the session's first append, else the previous
        unit's `terminator` re-injected at the head."""
        if (context is None) == (terminator is None):
            raise ValueError(
                "an append takes the system context (first append) or the previous "
                f"terminator (later appends), exactly one; got context={context is not None}, "
                f"terminator={terminator}"
            )
        segments = list(context) if context is not None else []
        head: tuple[int, ...] = () if terminator is None else (terminator, self.special.unit_end)
        offsets, heads = self._add_units(segments, unit_embeds, head)
        return AppendRows(tuple(segments), len(unit_embeds), offsets, heads)

    def rebuild(
        self,
        system: Sequence[RowSegment],
        history: Sequence[tuple[torch.Tensor, Sequence[int]]],  # ([10, hidden], tokens) per unit
        unit_embeds: Sequence[torch.Tensor],  # each [10, hidden]
    ) -> AppendRows:
        """A whole prompt (the `context` window): `system`, the retained units with their
        sampled tokens, then the new units. The offsets cover retained and new units."""
        segments = list(system)
        offsets: list[int] = []
        for embeds, tokens in history:
            offsets += self._add_units(segments, [embeds], ())[0]
            segments.append(RowSegment((*tokens, self.special.unit_end)))
        offsets += self._add_units(segments, unit_embeds, ())[0]
        heads = (0,) * len(offsets)  # each unit's opening rows close the unit before it
        return AppendRows(tuple(segments), len(unit_embeds), tuple(offsets), heads, restarts=True)

    def _add_units(
        self, segments: list[RowSegment], unit_embeds: Sequence[torch.Tensor], head: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Append `<unit>` + embeddings per unit (`head` before the first, `</unit>` before the
        others) to `segments`; returns each unit's `<unit>` row index and lead length."""
        if not unit_embeds:
            raise ValueError("an append needs at least one unit")
        offsets, heads = [], []
        for index, embeds in enumerate(unit_embeds):
            if embeds.dim() != 2 or embeds.shape[0] != EMBEDS_PER_UNIT:
                raise ValueError(
                    f"unit {index} has embeds {tuple(embeds.shape)}, "
                    f"expected [{EMBEDS_PER_UNIT}, hidden]"
                )
            lead = head if index == 0 else (self.special.unit_end,)
            segments.append(RowSegment((*lead, self.special.unit)))
            offsets.append(sum(len(segment.token_ids) for segment in segments) - 1)
            heads.append(len(lead))
            segments.append(RowSegment((self.audio_id,) * EMBEDS_PER_UNIT, embeds))
        return tuple(offsets), tuple(heads)

    def _text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))
