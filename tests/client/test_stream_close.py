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

from backends.serving.server_process import free_port
from client.stream_close import half_close, stop_stream


SETTLE_S = 30.0  # a bound for threads that are ending, not a timing: a leaked thread never ends
STUCK_S = 120.0  # a stuck graceful close ends by itself only after this (a cancel ends it at once)


def _new_threads_end(before: set[threading.Thread], timeout_s: float = SETTLE_S) -> list[str]:
    """Wait for the threads started since `before` was taken to end; the names of those left.
    Only those are compared: threads of earlier tests may still be ending meanwhile."""
    deadline = time.monotonic() + timeout_s
    while (left := [t.name for t in threading.enumerate() if t not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_cancelled_streams_leave_no_thread() -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{free_port()}")
    try:
        before = set(threading.enumerate())
        for _ in range(5):
            client.start_stream(callback=lambda result, error: None)
            stop_stream(client, cancel=True)
        assert _new_threads_end(before) == []
        client.start_stream(callback=lambda result, error: None)
        stop_stream(client, cancel=False)  # graceful: tritonclient ends the iterator itself
        assert _new_threads_end(before) == []
        stop_stream(client, cancel=True)  # no stream open: a no-op
    finally:
        client.close()


def test_a_half_close_leaves_no_thread_and_is_a_no_op_without_a_stream() -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{free_port()}")
    try:
        before = set(threading.enumerate())
        client.start_stream(callback=lambda result, error: None)
        assert half_close(client, timeout_s=5.0) and client._stream is None
        assert _new_threads_end(before) == []
        assert half_close(client, timeout_s=5.0)
    finally:
        client.close()


class _StuckStream:
    """A stream whose graceful close waits for requests that never finish, until cancelled."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.graceful_close_cut_short = threading.Event()  # the cancel ended the graceful close

    def close(self, cancel_requests: bool = False) -> None:
        if cancel_requests:
            self.cancelled.set()
        elif self.cancelled.wait(STUCK_S):
            self.graceful_close_cut_short.set()


class _ClientWithStuckStream:
    def __init__(self) -> None:
        self._stream = _StuckStream()

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self._stream.close(cancel_requests)
        self._stream = None


def test_a_half_close_that_outlives_its_bound_is_cancelled() -> None:
    """half_close gives up after its bound and cancels: the graceful close it left running ends
    by that cancel, not by the stream's own (much later) end."""
    client = _ClientWithStuckStream()
    stream = client._stream
    assert half_close(client, timeout_s=0.2) is False
    assert stream.cancelled.is_set()
    assert stream.graceful_close_cut_short.wait(SETTLE_S)
    deadline = time.monotonic() + SETTLE_S  # the closing thread returns after the cancel
    while client._stream is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client._stream is None
