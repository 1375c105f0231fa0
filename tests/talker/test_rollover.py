"""Tests for backends/talker/rollover.py: where a condition's rows go in the Talker KV.

Strategy: `plan_prompt` is pure, so each case builds small tensors whose rows are
recognisable (row i of a condition holds its own marker value) and checks the plan's kind,
row order and ledger ids exactly; `embed_codes` is a fake that encodes the codec id in the row.
"""

from __future__ import annotations

import pytest
import torch

from backends.contracts.errors import StageFailure
from backends.talker.rollover import (
    CONDITION_PLACEHOLDER_ID,
    MAX_ROLLOVER_CODES,
    ChunkRecord,
    PromptKind,
    PromptPlan,
    plan_prompt,
)

HIDDEN = 4
CONTEXT = 64
RESERVE = 26


def rows(num_rows: int, marker: float) -> torch.Tensor:
    """[num_rows, HIDDEN] float32 whose every value is `marker`."""
    return torch.full((num_rows, HIDDEN), marker)


def fake_embed_codes(codes: list[int]) -> torch.Tensor:
    """[k, HIDDEN] float32: row j holds 1000 + codes[j], so the replayed codes are visible."""
    return torch.tensor(codes, dtype=torch.float32)[:, None].expand(-1, HIDDEN) + 1000.0


def plan(
    condition: torch.Tensor,
    num_computed: int,
    last_chunk: ChunkRecord | None = None,
    turn_start: bool = False,
) -> PromptPlan:
    return plan_prompt(
        condition,
        RESERVE,
        turn_start=turn_start,
        num_computed=num_computed,
        last_chunk=last_chunk,
        context=CONTEXT,
        embed_codes=fake_embed_codes,
    )


def test_append_when_condition_and_reserve_fit() -> None:
    condition = rows(5, 1.0)
    result = plan(condition, num_computed=CONTEXT - 5 - RESERVE)
    assert result.kind is PromptKind.APPEND
    assert torch.equal(result.embeds, condition)
    assert result.token_ids == [CONDITION_PLACEHOLDER_ID] * 5


def test_turn_start_is_fresh_even_with_room() -> None:
    result = plan(rows(5, 1.0), num_computed=10, turn_start=True)
    assert result.kind is PromptKind.FRESH
    assert result.num_rows == 5


def test_rollover_one_token_past_the_context() -> None:
    """Catches an off-by-one in the capacity check: computed + rows + reserve = context + 1."""
    last = ChunkRecord(rows(3, 2.0), (7, 8))
    result = plan(rows(5, 1.0), num_computed=CONTEXT - 5 - RESERVE + 1, last_chunk=last)
    assert result.kind is PromptKind.ROLLOVER
    assert result.token_ids == [CONDITION_PLACEHOLDER_ID] * 3 + [7, 8] + [
        CONDITION_PLACEHOLDER_ID
    ] * 5
    expected = torch.cat([rows(3, 2.0), rows(1, 1007.0), rows(1, 1008.0), rows(5, 1.0)])
    assert torch.equal(result.embeds, expected)


def test_rollover_without_codes_keeps_previous_condition() -> None:
    """A turn-start chunk that ended at its first sample has no codes to replay."""
    last = ChunkRecord(rows(3, 2.0), ())
    result = plan(rows(5, 1.0), num_computed=CONTEXT, last_chunk=last)
    assert result.kind is PromptKind.ROLLOVER
    assert torch.equal(result.embeds, torch.cat([rows(3, 2.0), rows(5, 1.0)]))


def test_no_previous_chunk_falls_back_to_fresh() -> None:
    result = plan(rows(5, 1.0), num_computed=CONTEXT)
    assert result.kind is PromptKind.FRESH


def test_condition_alone_too_long_is_context_length_exceeded() -> None:
    with pytest.raises(StageFailure) as info:
        plan(rows(CONTEXT - RESERVE + 1, 1.0), num_computed=0)
    assert info.value.error.code == "context_length_exceeded"


def test_rollover_prompt_too_long_is_context_length_exceeded() -> None:
    """docs/model_facts.md#talker-context-and-rollover: an over-long rollover is a failure, never
    a silent truncation."""
    last = ChunkRecord(rows(20, 2.0), tuple(range(20)))
    with pytest.raises(StageFailure) as info:
        plan(rows(10, 1.0), num_computed=CONTEXT, last_chunk=last)
    assert info.value.error.code == "context_length_exceeded"
    assert "rollover" in info.value.error.message


def test_chunk_record_refuses_more_than_103_codes() -> None:
    with pytest.raises(ValueError, match="at most"):
        ChunkRecord(rows(1, 0.0), tuple(range(MAX_ROLLOVER_CODES + 1)))
