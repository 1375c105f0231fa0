"""How a stage says that one request failed: a stable code plus a message.

Inside an engine, `StageFailure` unwinds the work of one request; the request's sink is then
closed with the carried `StageError`, which the orchestrator's stage client raises as
`StageCallError` (backends/contracts/stage_clients.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StageError:
    """An error that ends one request; `code` is a stable machine-readable reason."""

    code: str  # e.g. "invalid_argument", "context_length_exceeded", "resource_exhausted", "internal"
    message: str


class StageFailure(Exception):
    """Raised inside an engine for a request-scoped failure; carries a StageError."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.error = StageError(code, message)
