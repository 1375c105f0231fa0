"""What one fast-path step carries from its forward to its results."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.runner.types import StepInput, StepResult


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One step's forward as the sampler sees it."""

    hidden: torch.Tensor  # [num_rows, hidden] final hidden states, rows in batch order
    logits: torch.Tensor  # [num_sampled, vocab] float32, one row per sampling input
    row_starts: list[int]  # first hidden row of each input
    positions: list[list[int]]  # positions of each input's rows
    tokens: torch.Tensor | None = None  # [>= num_inputs] int64 drawn in the graph, batch order


@dataclass(frozen=True, slots=True)
class SamplePlan:
    sampled: list[int]  # inputs that sample, in order (= logits rows)
    on_device: list[int]  # indices into `sampled` drawn by the device sampler
    on_host: list[int]  # indices into `sampled` drawn on the host (hook or penalty)


def step_results(
    inputs: list[StepInput],
    positions: list[list[int]],
    tokens: list[int | None],
    hidden: torch.Tensor | None,
) -> list[StepResult]:
    """One result per input: its positions, its token (None if it drew none) and its captured
    hidden rows, taken in order from `hidden` ([captured rows, hidden] float32)."""
    results, offset = [], 0
    for i, inp in enumerate(inputs):
        rows = None
        if inp.capture_hidden and hidden is not None:
            rows = hidden[offset : offset + inp.num_rows]
            offset += inp.num_rows
        results.append(StepResult(inp.request_id, positions[i], tokens[i], rows))
    return results
