"""Where a session's events go: the START request's response stream, or a test recorder.

A long session may move its downlink to a fresh request of its own (`action=move_downlink`):
the old request then ends with `downlink.moved` and its FINAL, and every later event goes to the
new one. The server keeps per open request what it has answered on it (docs/triton_behaviours.md,
"Host memory of a long-lived stream"); a move lets the old request's share go.
"""
from __future__ import annotations

from typing import Protocol

from backends.duplex import events as ev


class Downlink(Protocol):
    def send(self, event: ev.ServerEvent) -> None: ...

    def close(self) -> None: ...

    def is_cancelled(self) -> bool:
        """True once the client cancelled the stream or disconnected (an IPC call in Triton)."""
        ...

    def move(self, to: Downlink, notice: ev.ServerEvent) -> bool:
        """Send `notice` and the FINAL here, then carry every later event on `to`'s request;
        atomic against `send` and `close`. False (nothing moved) once this downlink is closed."""
        ...

    def abandon(self) -> None:
        """The session ended without the client's END, or its START was refused: free what the
        transport holds for it. Blocking; never called on the thread that handles uplinks."""
        ...
