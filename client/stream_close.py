"""Stopping a tritonclient gRPC stream without leaving a thread behind.

tritonclient 2.51's `stop_stream(cancel_requests=True)` cancels the RPC but never ends the
stream's request iterator: grpc's request-consumer thread stays blocked on the stream's request
queue for the life of the process, holding the stream with it. Every cancelled stream leaked one
thread (the `duplex` orchestrator, which opens a stream per stage call, had ~4500 of them after
a few minutes at 32 sessions). Ending the iterator after the cancel lets that thread return.
"""
from __future__ import annotations

from typing import Any


def stop_stream(client: Any, cancel: bool) -> None:
    """`client.stop_stream(cancel_requests=cancel)`, then release a cancelled stream's request
    consumer (the None sentinel ends tritonclient's request iterator)."""
    stream = getattr(client, "_stream", None)
    client.stop_stream(cancel_requests=cancel)
    queue = getattr(stream, "_request_queue", None)
    if cancel and queue is not None:
        queue.put(None)
