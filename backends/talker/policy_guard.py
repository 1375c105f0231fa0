"""A request's chunk policy, fenced so its failure stays that request's failure.

The policy runs inside the runner's shared step: an exception there would abort the forward of
every request in the batch. The guard records the exception instead, forces EOS (so nothing
more is forwarded for the request) and lets the engine fail just that request after the step.
"""

from __future__ import annotations

import torch

from backends.models.talker_policy import ChunkKind, TalkerChunkPolicy
from backends.runner.types import SampleContext, SamplingHook


class PolicyGuard:
    """A runner SamplingHook wrapping one request's TalkerChunkPolicy."""

    def __init__(self, policy: TalkerChunkPolicy, eos_id: int) -> None:
        self.policy = policy
        self.eos_id = eos_id
        self.error: Exception | None = None  # the first exception the policy raised

    @property
    def runner_hook(self) -> SamplingHook | None:
        """The runner calls this guard itself for every row of the request."""
        return self

    def attach(self, slot: int) -> None:
        """Nothing to do: the policy's state lives in this object, whatever the slot."""

    def detach(self, slot: int) -> None:
        """Nothing to do: the history survives re-admission with this object."""

    def begin_chunk(self, kind: ChunkKind) -> None:
        self.policy.begin_chunk(kind)

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        """logits: [num_audio_tokens] float32, modified in place by the policy."""
        if self.error is not None:
            return self.eos_id
        try:
            return self.policy.before_sample(logits, ctx)
        except Exception as exc:  # reported by the engine after the step, for this request
            self.error = exc
            return self.eos_id

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        if self.error is not None:
            return self.eos_id
        try:
            return self.policy.after_sample(token, ctx)
        except Exception as exc:  # reported by the engine after the step, for this request
            self.error = exc
            return self.eos_id
