"""How the orchestrator calls the three stages: in the server over gRPC streams to the server
itself (backends/serving/grpc_stages.py), in tests on engines in the same process."""
from __future__ import annotations

from typing import Iterator, Protocol

from backends.contracts.errors import StageError
from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult,
)

THINKER = "thinker"
TALKER = "talker"
CODE2WAV = "code2wav"
STAGES = (THINKER, TALKER, CODE2WAV)


class StageCallError(Exception):
    """A stage answered a request with an error."""

    def __init__(self, stage: str, error: StageError) -> None:
        super().__init__(f"{stage}: [{error.code}] {error.message}")
        self.stage = stage
        self.error = error


class StageClients(Protocol):
    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]: ...

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]: ...

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]: ...

    def expect_window(self, request_id: str) -> None:
        """Announce a reply's first Code2Wav window for `request_id` (its Talker is starting):
        Code2Wav holds windows that can wait until it comes. Sent, not awaited."""
        ...

    def stop(self, stage: str, request_id: str) -> None:
        """Explicit stop of a stage request: the orchestrator never cancels one (a cancellation
        racing the request's end can crash Triton 2.51's gRPC frontend)."""
        ...
