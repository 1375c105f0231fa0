"""Where a stage engine delivers results: one sink per Triton request.

The serving layer implements a sink over a Triton response sender; tests implement it with
a list. A sink is closed exactly once: `close()` after the last result, `finish(result)` with
it, or `close(error)`. `finish` exists for the transport: over Triton the last result and the
FINAL flag travel as one response, where `send` + `close` cost a second IPC message and a
second gRPC message that the caller waits for.
"""
from __future__ import annotations

from typing import Any, Protocol

from backends.contracts.errors import StageError


class ResponseSink(Protocol):
    def send(self, result: Any) -> None: ...

    def close(self, error: StageError | None = None) -> None: ...

    def finish(self, result: Any) -> None:
        """`send(result)` then `close()`, as one answer where the transport can."""
        ...


class ListSink:
    """A sink that records results in memory (tests, stage warm-ups)."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.error: StageError | None = None
        self.closed = False

    def send(self, result: Any) -> None:
        if self.closed:
            raise RuntimeError("send after close")
        self.results.append(result)

    def close(self, error: StageError | None = None) -> None:
        if self.closed:
            raise RuntimeError("sink closed twice")
        self.closed = True
        self.error = error

    def finish(self, result: Any) -> None:
        self.send(result)
        self.close()
