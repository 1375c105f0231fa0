"""Stopping a tritonclient gRPC stream without leaving a thread behind, and ending one without
cancelling the requests it carries (`half_close`).

tritonclient 2.51's `stop_stream(cancel_requests=True)` cancels the RPC but never ends the
stream's request iterator: grpc's request-consumer thread stays blocked on the stream's request
queue for the life of the process, holding the stream with it. Every cancelled stream leaked one
thread (the `duplex` orchestrator, which opens a stream per stage call, had ~4500 of them after
a few minutes at 32 sessions). Ending the iterator after the cancel lets that thread return.
"""
from __future__ import annotations

import threading
from typing import Any


def stop_stream(client: Any, cancel: bool) -> None:
    """`client.stop_stream(cancel_requests=cancel)`, then release a cancelled stream's request
    consumer (the None sentinel ends tritonclient's request iterator)."""
    stream = getattr(client, "_stream", None)
    client.stop_stream(cancel_requests=cancel)
    queue = getattr(stream, "_request_queue", None)
    if cancel and queue is not None:
        queue.put(None)


def half_close(client: Any, timeout_s: float) -> bool:
    """End the client's stream without cancelling its RPC: the server finishes the requests the
    stream carries, then ends it. Triton 2.51's gRPC frontend can crash when a cancellation
    races a request's completion (server#7368, #8034), so a stream that may carry a live request
    ends this way. A stream that does not end within `timeout_s` is cancelled after all (a
    stage that stopped answering); returns False then. No stream open: a no-op."""
    stream = getattr(client, "_stream", None)
    if stream is None:
        return True
    closer = threading.Thread(target=client.stop_stream, kwargs={"cancel_requests": False},
                              name="stream-half-close", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if not closer.is_alive():
        return True
    try:
        stream.close(cancel_requests=True)  # unblocks the half-close, which then returns
    except Exception:  # both closes join one handler; the other may have cleared it meanwhile
        pass
    closer.join(timeout_s)
    return False
