"""Errors the orchestrator reports to clients, with stable codes
(docs/duplex_contract.md#errors)."""
from __future__ import annotations

INVALID_ARGUMENT = "invalid_argument"
RESOURCE_EXHAUSTED = "resource_exhausted"
NOT_FOUND = "session_not_found"
SESSION_EXISTS = "session_exists"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
STAGE_FAILED = "stage_failed"
INTERNAL = "internal"


class DuplexError(Exception):
    """A client-visible error: `code` is machine-readable, the message names the session."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
