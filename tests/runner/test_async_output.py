"""AsyncOutput and PendingStep semantics on CPU (the CUDA event path runs in tests/runner_gpu).

Strategy: the host copies must hold the device values at wait time and be independent of later
writes to the sources; a PendingStep runs its finisher exactly once.
"""

from __future__ import annotations

import pytest
import torch

from backends.runner.async_output import AsyncOutput, PendingStep
from backends.runner.types import StepResult


def test_wait_returns_host_copies() -> None:
    source = torch.arange(6, dtype=torch.int64)
    output = AsyncOutput({"tokens": source})
    source.zero_()
    assert output.wait()["tokens"].tolist() == [0, 1, 2, 3, 4, 5]


def test_pending_step_finishes_once() -> None:
    calls: list[int] = []
    result = StepResult("r", [0], 1, None)

    def finish() -> list[StepResult]:
        calls.append(1)
        return [result]

    pending = PendingStep(finish)
    assert not pending.is_finished
    assert pending.wait() == [result] and pending.wait() == [result]
    assert calls == [1] and pending.is_finished
    assert PendingStep.done([]).wait() == []


def test_a_failed_finish_runs_once_and_every_wait_raises_it() -> None:
    calls: list[int] = []

    def finish() -> list[StepResult]:
        calls.append(1)
        raise RuntimeError("finish failed")

    pending = PendingStep(finish)
    pending.settle()  # the failure is the launcher's: an unrelated caller goes on
    for _ in range(2):
        with pytest.raises(RuntimeError, match="finish failed"):
            pending.wait()
    assert calls == [1] and pending.is_finished
