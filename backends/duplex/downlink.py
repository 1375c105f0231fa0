"""Where a session's events go: the START request's response stream, or a test recorder."""
from __future__ import annotations

from typing import Protocol

from backends.duplex import events as ev


class Downlink(Protocol):
    def send(self, event: ev.ServerEvent) -> None: ...

    def close(self) -> None: ...

    def is_cancelled(self) -> bool:
        """True once the client cancelled the stream or disconnected (an IPC call in Triton)."""
        ...

    def abandon(self) -> None:
        """The session ended without the client's END, or its START was refused: free what the
        transport holds for it. Blocking; never called on the thread that handles uplinks."""
        ...
