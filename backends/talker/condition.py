"""A Talker condition: one speak unit's handoff, checked and turned into conditioning rows.

The rows are computed when the condition arrives (not when it starts), so a malformed handoff
is refused on its own sink at once, and the step that later prefills it does no model work
besides the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from backends.models.talker import TalkerModel
from backends.models.talker_policy import CHUNK_BUDGETS, ChunkKind
from backends.runner.host_staging import to_device
from backends.stages.contracts import TalkerRequest
from backends.stages.sink import ResponseSink, StageFailure


@dataclass(frozen=True, slots=True)
class Condition:
    """An accepted condition waiting for (or generating) its chunk."""

    request: TalkerRequest
    sink: ResponseSink
    kind: ChunkKind
    embeds: torch.Tensor | None  # [m + 1, hidden] model dtype; None for an empty handoff

    @property
    def reserve(self) -> int:
        """Samples the chunk may draw, its forced EOS included: 26, or 104 at turn end."""
        return CHUNK_BUDGETS[self.kind].max_samples


def chunk_kind(request: TalkerRequest) -> ChunkKind:
    """Turn end wins over turn start: a one-unit turn gets the long, early-EOS budget."""
    if np.asarray(request.token_ids).size == 0:
        return ChunkKind.EMPTY
    if request.turn_end:
        return ChunkKind.TURN_END
    return ChunkKind.TURN_START if request.turn_start else ChunkKind.MID_TURN


def build_condition(
    model: TalkerModel, request: TalkerRequest, sink: ResponseSink, device: torch.device
) -> Condition:
    """Validate the handoff and compute its rows; raises StageFailure("invalid_argument")."""
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
    # Pinned, queued copies: a pageable copy would make the engine thread wait for the device.
    with torch.inference_mode():
        embeds = model.condition_embeds(
            to_device(token_ids.astype(np.int64, copy=False), device),  # [m] int64
            to_device(hidden.astype(np.float32, copy=False), device),  # [m, llm_dim] float32
        )
    return Condition(request, sink, kind, embeds)
