"""client.stream_close: a cancelled tritonclient stream leaves no thread behind; a half-closed
one is not cancelled unless it outlives its bound.

Runs tritonclient's real stream machinery against a port nobody listens on (the RPC fails, the
threads it started are what is checked). The server-level check is the leak test's orchestrator
thread count (tests/server/test_reliability_leaks.py).
"""
from __future__ import annotations

import threading
import time

import tritonclient.grpc as grpcclient

from backends.serving.launcher import free_port
from client.stream_close import half_close, stop_stream


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


def test_a_half_close_leaves_no_thread_and_is_a_no_op_without_a_stream() -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{free_port()}")
    try:
        before = threading.active_count()
        client.start_stream(callback=lambda result, error: None)
        assert half_close(client, timeout_s=5.0) and client._stream is None
        assert _threads_settle(before) == before
        assert half_close(client, timeout_s=5.0)
    finally:
        client.close()


class _StuckStream:
    """A stream whose graceful close waits for requests that never finish, until cancelled."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def close(self, cancel_requests: bool = False) -> None:
        if cancel_requests:
            self.cancelled.set()
        self.cancelled.wait(10.0)


class _ClientWithStuckStream:
    def __init__(self) -> None:
        self._stream = _StuckStream()

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self._stream.close(cancel_requests)
        self._stream = None


def test_a_half_close_that_outlives_its_bound_is_cancelled() -> None:
    client = _ClientWithStuckStream()
    stream = client._stream
    started = time.monotonic()
    assert half_close(client, timeout_s=0.2) is False
    assert stream.cancelled.is_set() and client._stream is None and time.monotonic() - started < 5.0
