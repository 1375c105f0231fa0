"""The duplex policy as the runner's sampling hook, with its failures kept per session."""

from __future__ import annotations

from collections.abc import Callable

import torch

from backends.runner.host_draws import DrawSteps, run_alone
from backends.runner.host_rows import CompactRow
from backends.runner.types import SampleContext
from backends.thinker.duplex_policy import DuplexPolicy


class IsolatingHook:
    """Runs the policy inside the runner's step; an exception is kept for the engine (which
    fails only this session) instead of aborting the whole batch half-sampled."""

    def __init__(self, policy: DuplexPolicy, fallback: int) -> None:
        self.policy = policy
        self.fallback = fallback  # a chunk terminator: ends the unit whatever happened
        self.error: Exception | None = None

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        return self._guarded(lambda: self.policy.before_sample(logits, ctx))

    def before_sample_compact(self, row: CompactRow, ctx: SampleContext) -> int | None:
        return run_alone(self.decide_compact(row, ctx))

    def decide_compact(self, row: CompactRow, ctx: SampleContext) -> DrawSteps:
        """`before_sample_compact` as steps (`DuplexPolicy.decide_compact`), guarded alike."""
        try:
            return (yield from self.policy.decide_compact(row, ctx))
        except Exception as err:  # noqa: BLE001 - as in _guarded
            self.error = self.error or err
            return self.fallback

    def _guarded(self, decide: Callable[[], int | None]) -> int | None:
        try:
            return decide()
        except Exception as err:  # noqa: BLE001 - re-raised by the engine for this session only
            self.error = self.error or err
            return self.fallback

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        if self.error is not None:
            return token
        try:
            return self.policy.after_sample(token, ctx)
        except Exception as err:  # noqa: BLE001 - as above
            self.error = err
            return token
