"""What the Talker engine keeps per request id: queued conditions, the chunk being generated,
and the last finished chunk (the rollover's replay material).

One Talker request lives for one session epoch; each condition (a speak unit's handoff) is one
chunk of codec frames with its own sink. Conditions of a request run strictly one after the
other, in condition_seq order, because each one is appended to the KV its predecessor left.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backends.contracts.errors import StageFailure
from backends.contracts.messages import TalkerCodes, TalkerRequest
from backends.contracts.sink import ResponseSink
from backends.models.talker_policy import ChunkKind
from backends.runner.types import SamplingHook, StepInput
from backends.talker.condition import Condition
from backends.talker.rollover import ChunkRecord

# Frames per streamed group: one second of 25 Hz codec frames, the Code2Wav window body.
FRAMES_PER_GROUP = 25


class ChunkPolicy(Protocol):
    """A request's chunk policy as the engine drives it: a host hook (`PolicyGuard`) or a
    row of the device table (`DevicePolicy`)."""

    error: Exception | None  # set when the policy failed inside a step (host hooks only)

    @property
    def runner_hook(self) -> SamplingHook | None:
        """What `ModelRunner.add_request` gets as the request's hook."""
        ...

    def attach(self, slot: int) -> None:
        """Called after every admission of the request, with its runner slot."""
        ...

    def detach(self, slot: int) -> None:
        """Called before a re-admission frees the request's slot."""
        ...

    def begin_chunk(self, kind: ChunkKind) -> None: ...


@dataclass(slots=True)
class ActiveChunk:
    """The condition now being generated, and the frames it has produced so far."""

    condition: Condition
    next_input: StepInput  # what this request forwards in the next runner step
    codes: list[int] = field(default_factory=list)  # every confirmed frame, in order
    num_sent: int = 0  # frames already streamed to the sink

    @property
    def max_codes(self) -> int:
        """Frames the budget allows: the last sample of the reserve is always EOS."""
        return self.condition.reserve - 1

    @property
    def draws_left(self) -> int:
        """Draws until the chunk must end, its forced EOS included."""
        return self.max_codes - len(self.codes) + 1

    def group_ready(self) -> bool:
        return len(self.codes) - self.num_sent >= FRAMES_PER_GROUP

    def take_group(self, finished: bool) -> TalkerCodes:
        """The unsent frames (at most one group unless finished) as one TalkerCodes."""
        end = len(self.codes) if finished else self.num_sent + FRAMES_PER_GROUP
        frames = np.asarray(self.codes[self.num_sent : end], dtype=np.int32)  # [k] int32
        self.num_sent = end
        request = self.condition.request
        return TalkerCodes(request.request_id, request.condition_seq, frames, finished)


@dataclass(slots=True)
class TalkerStream:
    """All Talker state of one request id (one session epoch)."""

    request_id: str
    hook: ChunkPolicy  # the chunk policy; survives rollovers so its code history does too
    last_seq: int | None = None  # condition_seq of the last accepted condition
    queue: deque[Condition] = field(default_factory=deque)
    active: ActiveChunk | None = None
    is_admitted: bool = False  # the runner holds a request (and its KV reservation) for us
    last_chunk: ChunkRecord | None = None

    def has_work(self) -> bool:
        return self.active is not None or bool(self.queue)

    def open_sinks(self) -> list[ResponseSink]:
        """Sinks still owed a close: the active chunk's, then the queued ones in order."""
        sinks = [self.active.condition.sink] if self.active is not None else []
        return sinks + [condition.sink for condition in self.queue]


def check_next_seq(stream: TalkerStream | None, request: TalkerRequest) -> None:
    """The first condition of a request may start at any seq >= 0; later ones must be +1.

    A skipped or repeated seq means a lost or replayed handoff, after which the KV no longer
    matches what the Thinker said: the caller ends the request
    (docs/model_facts.md#talker-context-and-rollover).
    """
    seq = request.condition_seq
    last = stream.last_seq if stream is not None else None
    if seq < 0 or (last is not None and seq != last + 1):
        expected = "a value >= 0" if last is None else str(last + 1)
        raise StageFailure(
            "invalid_argument",
            f"talker request {request.request_id}: condition_seq {seq} is not consecutive "
            f"(expected {expected})",
        )
