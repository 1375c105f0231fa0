"""Where a condition's rows go in the Talker KV: appended, a fresh prompt, or a rollover.

All conditions of one request share the Talker context (4096 tokens for the checkpoint): a
condition is appended after what is already in KV until `computed + condition + reserve` would
overflow it. Then the prompt is rebuilt from zero as [previous condition] + [previous chunk's
codes] + [current condition] (docs/model_facts.md#talker-context-and-rollover), so one chunk of
acoustic context survives the cut. A turn start always replaces the prompt, so a rollover never
crosses a turn boundary.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.contracts.errors import StageFailure
from backends.models.talker import TalkerModel

# Upstream's scheduler prompt for a condition is all zeros: the rows' content is in the
# injected embeddings, the ledger id only has to be a valid placeholder.
CONDITION_PLACEHOLDER_ID = 0
# The longest chunk (turn end, 104 samples) confirms at most 103 codes; a rollover replays them.
MAX_ROLLOVER_CODES = 103


class PromptKind(enum.Enum):
    APPEND = "append"  # rows go after what is already in KV
    FRESH = "fresh"  # KV is dropped; the condition alone starts a new prompt
    ROLLOVER = "rollover"  # KV is dropped; previous condition + its codes + this condition


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """The last finished chunk of a request: what a rollover replays."""

    embeds: torch.Tensor  # [m + 1, hidden] model dtype: that chunk's condition rows
    codes: tuple[int, ...]  # its confirmed codec ids in order, EOS excluded

    def __post_init__(self) -> None:
        if len(self.codes) > MAX_ROLLOVER_CODES:
            raise ValueError(
                f"a chunk record holds at most {MAX_ROLLOVER_CODES} codes, got {len(self.codes)}"
            )


@dataclass(frozen=True, slots=True)
class PromptPlan:
    kind: PromptKind
    embeds: torch.Tensor  # [n, hidden] model dtype: rows to prefill
    token_ids: list[int]  # [n] ledger ids of those rows

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)


def plan_prompt(
    condition: torch.Tensor,
    reserve: int,
    *,
    turn_start: bool,
    num_computed: int,
    last_chunk: ChunkRecord | None,
    context: int,
    embed_codes: Callable[[list[int]], torch.Tensor],
) -> PromptPlan:
    """Plan the prefill of one condition.

    condition: [m + 1, hidden] condition rows (audio_bos last); reserve: samples this chunk may
    draw; num_computed: tokens now in this request's KV; embed_codes: codec ids -> [k, hidden]
    (the Talker's emb_code). Raises StageFailure("context_length_exceeded") when even the
    planned prompt leaves no room for the reserve.
    """
    fresh = PromptPlan(PromptKind.FRESH, condition, _placeholders(condition.shape[0]))
    _require_room(fresh.num_rows, reserve, context, "the condition alone")
    if turn_start:
        return fresh
    if num_computed + fresh.num_rows + reserve <= context:
        return PromptPlan(PromptKind.APPEND, condition, fresh.token_ids)
    if last_chunk is None:
        return fresh
    plan = _rollover_plan(condition, last_chunk, embed_codes)
    _require_room(plan.num_rows, reserve, context, "the rollover prompt")
    return plan


def _rollover_plan(
    condition: torch.Tensor,
    last_chunk: ChunkRecord,
    embed_codes: Callable[[list[int]], torch.Tensor],
) -> PromptPlan:
    codes = list(last_chunk.codes)
    parts = [last_chunk.embeds]
    if codes:
        parts.append(embed_codes(codes).to(condition.dtype))
    parts.append(condition)
    token_ids = (
        _placeholders(last_chunk.embeds.shape[0]) + codes + _placeholders(condition.shape[0])
    )
    return PromptPlan(PromptKind.ROLLOVER, torch.cat(parts, dim=0), token_ids)


def embed_codes(model: TalkerModel, device: torch.device, codes: list[int]) -> torch.Tensor:
    """codes: k codec ids -> [k, hidden] emb_code rows (the runner's own input table)."""
    with torch.inference_mode():
        return model.embed_tokens(torch.tensor(codes, dtype=torch.int64, device=device))


def _require_room(num_rows: int, reserve: int, context: int, what: str) -> None:
    if num_rows + reserve > context:
        raise StageFailure(
            "context_length_exceeded",
            f"{what} ({num_rows} rows) plus the generation reserve ({reserve}) exceeds the "
            f"Talker context of {context} tokens",
        )


def _placeholders(num_rows: int) -> list[int]:
    return [CONDITION_PLACEHOLDER_ID] * num_rows
