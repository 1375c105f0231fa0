"""A Talker condition: one speak unit's handoff, checked and turned into conditioning rows.

A handoff is checked when it arrives, so a malformed one is refused on its own sink at once.
Its rows (the projection of the Thinker's hidden states) are computed at the next engine step
for every condition that arrived since, in one batched pass: per condition it is a dozen small
launches and host copies, which at 16 sessions had cost the engine thread milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from backends.contracts.errors import StageFailure
from backends.contracts.messages import TalkerRequest
from backends.contracts.sink import ResponseSink
from backends.models.talker import TalkerModel
from backends.models.talker_policy import CHUNK_BUDGETS, ChunkKind
from backends.runner.host_staging import to_device

if TYPE_CHECKING:
    from backends.talker.request_state import TalkerStream


@dataclass(frozen=True, slots=True)
class Condition:
    """An accepted condition waiting for (or generating) its chunk."""

    request: TalkerRequest
    sink: ResponseSink
    kind: ChunkKind
    embeds: torch.Tensor | None  # [m + 1, hidden] model dtype; None until projected, or empty

    @property
    def reserve(self) -> int:
        """Samples the chunk may draw, its forced EOS included: 26, or 104 at turn end."""
        return CHUNK_BUDGETS[self.kind].max_samples

    @property
    def needs_rows(self) -> bool:
        return self.embeds is None and self.kind is not ChunkKind.EMPTY


def chunk_kind(request: TalkerRequest) -> ChunkKind:
    """Turn end wins over turn start: a one-unit turn gets the long, early-EOS budget."""
    if np.asarray(request.token_ids).size == 0:
        return ChunkKind.EMPTY
    if request.turn_end:
        return ChunkKind.TURN_END
    return ChunkKind.TURN_START if request.turn_start else ChunkKind.MID_TURN


def check_condition(
    model: TalkerModel, request: TalkerRequest, sink: ResponseSink
) -> Condition:
    """Validate the handoff; raises StageFailure("invalid_argument"). Rows come later
    (`project_queued`)."""
    kind = chunk_kind(request)
    token_ids = np.asarray(request.token_ids)
    hidden = np.asarray(request.hidden)
    if kind is ChunkKind.EMPTY:
        if hidden.size != 0:
            raise StageFailure("invalid_argument", f"empty token_ids with hidden {hidden.shape}")
        return Condition(request, sink, kind, None)
    if token_ids.ndim != 1:
        raise StageFailure("invalid_argument", f"token_ids shape {token_ids.shape} is not [m]")
    num_text_tokens = model.config.num_text_tokens
    if token_ids.min() < 0 or token_ids.max() >= num_text_tokens:
        raise StageFailure("invalid_argument", f"token_ids outside [0, {num_text_tokens})")
    expected = (token_ids.shape[0], model.config.llm_dim)
    if hidden.shape != expected:
        raise StageFailure("invalid_argument", f"hidden shape {hidden.shape}, expected {expected}")
    return Condition(request, sink, kind, None)


def project_queued(
    model: TalkerModel, streams: Iterable[TalkerStream], device: torch.device
) -> None:
    """Every queued condition still without rows gets them, all in one batched pass."""
    waiting = [(s.queue, i) for s in streams for i, c in enumerate(s.queue) if c.needs_rows]
    if waiting:
        projected = project_conditions(model, [queue[i] for queue, i in waiting], device)
        for (queue, i), condition in zip(waiting, projected):
            queue[i] = condition


def project_conditions(
    model: TalkerModel, conditions: list[Condition], device: torch.device
) -> list[Condition]:
    """The checked, non-empty `conditions` with their rows (`TalkerModel.condition_embeds`)."""
    token_ids = [np.asarray(c.request.token_ids, dtype=np.int64) for c in conditions]
    hidden = [np.asarray(c.request.hidden, dtype=np.float32) for c in conditions]
    counts = [ids.shape[0] for ids in token_ids]
    # Pinned, queued copies: a pageable copy would make the engine thread wait for the device.
    with torch.inference_mode():
        embeds = model.condition_embeds_many(
            to_device(np.concatenate(token_ids), device),  # [sum m] int64
            to_device(np.concatenate(hidden), device),  # [sum m, llm_dim] float32
            counts,
        )
    return [replace(c, embeds=e) for c, e in zip(conditions, embeds)]
