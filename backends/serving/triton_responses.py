"""Response senders: exactly one FINAL per request, sends funnelled through one thread.

`ResponseThread` owns every `response_sender.send` of a model instance, so engine threads
never block on IPC to the server. `TritonSink` is the ResponseSink the engines write to:
its `close()` is idempotent and always ends the request with FINAL (with an error or not);
`finish(result)` puts the FINAL flag on the last result's own response.

An error after data ends the request with a flags-only FINAL: the caller sees a stream that
stopped before its terminal result (the talker's `finished` group), and the error itself goes
to the log. The rule dates from BLS callers: in Triton 2.51 a decoupled child's error response
reaches a BLS caller only when it is the request's first response (later ones are dropped, the
FINAL on them too, so the caller blocks forever: verified on our binaries). It stays the
stages' contract for every caller, the orchestrator's gRPC streams included, which treat a
stream that ends short as a failed call (backends/duplex/audio_tail.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from backends.contracts.errors import StageError

log = logging.getLogger(__name__)

# StageError.code -> TritonError code attribute name
ERROR_CODES = {
    "invalid_argument": "INVALID_ARG",
    "context_length_exceeded": "INVALID_ARG",
    "resource_exhausted": "UNAVAILABLE",
    "unavailable": "UNAVAILABLE",
    "cancelled": "CANCELLED",
    "not_found": "NOT_FOUND",
    # A stage request without this server's secret (2.51's TritonError has no PERMISSION_DENIED;
    # the `[forbidden]` prefix carries the reason).
    "forbidden": "INVALID_ARG",
}


def triton_error(pb_utils: Any, error: StageError) -> Any:
    """A TritonError whose message starts with `[code]` so callers recover the code."""
    code = getattr(pb_utils.TritonError, ERROR_CODES.get(error.code, "INTERNAL"))
    return pb_utils.TritonError(f"[{error.code}] {error.message}", code)


def parse_error_message(message: str) -> StageError:
    """Inverse of `triton_error` for a stage's caller; unknown formats become `internal`."""
    if message.startswith("[") and "] " in message:
        code, text = message[1:].split("] ", 1)
        return StageError(code, text)
    return StageError("internal", message)


class ResponseThread:
    def __init__(self, pb_utils: Any, name: str, on_sent: Callable[[float], None] | None = None) -> None:
        self._pb = pb_utils
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._on_sent = on_sent  # seconds from `put` to the send's return, per response
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, sender: Any, response: Any, flags: int) -> None:
        self._queue.put((sender, response, flags, time.perf_counter()))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._send(*item[:3])
            if self._on_sent is not None:
                self._on_sent(time.perf_counter() - item[3])
            # Hold no sender while waiting: the stub frees a request's response factory, which
            # pins its model (unload waits for it), only when the sender object is destroyed.
            item = None

    @staticmethod
    def _send(sender: Any, response: Any, flags: int) -> None:
        try:
            sender.send(response, flags=flags) if response is not None else sender.send(flags=flags)
        except Exception as exc:  # a client that went away must not stop the others
            log.warning("response send failed: %r", exc)
            if flags and response is not None:  # the FINAL must still go: the caller waits for it
                try:
                    sender.send(flags=flags)
                except Exception as final_exc:
                    log.warning("flags-only FINAL failed too: %r", final_exc)


class TritonSink:
    """ResponseSink over one Triton response sender."""

    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread,
                 encode: Callable[[Any], Any]) -> None:
        self._pb, self._sender, self._responses, self._encode = pb_utils, sender, responses, encode
        self._closed = False
        self._sent = False  # a data response went out: an error now ends as a plain FINAL
        self._lock = threading.Lock()  # send/close may come from the engine and a stop path

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, result: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("send after FINAL")
            self._responses.put(self._sender, self._encode(result), 0)
            self._sent = True

    def finish(self, result: Any) -> None:
        """The last result and the FINAL flag in one response (one send, one gRPC message)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("finish after FINAL")
            response = self._encode(result)
            self._closed = self._sent = True
            self._responses.put(self._sender, response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def close(self, error: StageError | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if error is not None and self._sent:  # see the module docstring: the FINAL must arrive
                log.warning("request ended after its first results: [%s] %s (sent as a plain FINAL)",
                            error.code, error.message)
                error = None
            final = self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            response = None if error is None else self._pb.InferenceResponse(error=triton_error(self._pb, error))
            self._responses.put(self._sender, response, final)
