"""client.stream_close: a cancelled tritonclient stream leaves no thread behind.

Runs tritonclient's real stream machinery against a port nobody listens on (the RPC fails, the
threads it started are what is checked). The server-level check is the leak test's orchestrator
thread count (tests/server/test_reliability_leaks.py).
"""
from __future__ import annotations

import threading
import time

import tritonclient.grpc as grpcclient

from backends.serving.launcher import free_port
from client.stream_close import stop_stream


def _threads_settle(expected: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while threading.active_count() > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return threading.active_count()


def test_cancelled_streams_leave_no_thread() -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{free_port()}")
    try:
        before = threading.active_count()
        for _ in range(5):
            client.start_stream(callback=lambda result, error: None)
            stop_stream(client, cancel=True)
        assert _threads_settle(before) == before
        client.start_stream(callback=lambda result, error: None)
        stop_stream(client, cancel=False)  # graceful: tritonclient ends the iterator itself
        assert _threads_settle(before) == before
        stop_stream(client, cancel=True)  # no stream open: a no-op
    finally:
        client.close()
