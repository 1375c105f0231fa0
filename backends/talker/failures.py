"""How the Talker engine reports a request's failure: the error it sends, a close that never
raises (one broken sink must not keep the others open)."""

from __future__ import annotations

import logging

from backends.contracts.errors import StageError
from backends.contracts.sink import ResponseSink

_LOG = logging.getLogger(__name__)


def internal_error(request_id: str, exc: Exception) -> StageError:
    return StageError("internal", f"talker request {request_id}: {type(exc).__name__}: {exc}")


def close_quietly(sink: ResponseSink, error: StageError) -> None:
    """Close a sink on a failure path; a sink that is already closed or broken is logged."""
    try:
        sink.close(error)
    except Exception:  # a broken sink must not stop the other sinks from closing
        _LOG.exception("closing a talker sink failed")
