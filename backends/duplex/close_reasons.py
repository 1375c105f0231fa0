"""Why a session closes (`session.closed` reason) and what each reason implies.

A close that no END of the client ended (the client is gone, went silent, or was told
`error`) frees the transport itself: such a client may never send END, and until one comes
Triton keeps the sequence slot and counts it in flight. Shutdown frees everything anyway.
"""
from __future__ import annotations

CLIENT = "client"  # the client's END
SHUTDOWN = "server_shutdown"
IDLE = "idle"
CLIENT_GONE = "client_gone"
ERROR = "error"


def frees_transport(reason: str) -> bool:
    return reason not in (CLIENT, SHUTDOWN)
