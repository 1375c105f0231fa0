"""Response senders: exactly one FINAL per request, sends funnelled through one thread.

`ResponseThread` owns every `response_sender.send` of a model instance, so engine threads
never block on IPC to the server. `TritonSink` is the ResponseSink the engines write to:
its `close()` is idempotent and always ends the request with FINAL (with an error or not).
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from backends.stages.sink import StageError

log = logging.getLogger(__name__)

# StageError.code -> TritonError code attribute name
ERROR_CODES = {
    "invalid_argument": "INVALID_ARG",
    "context_length_exceeded": "INVALID_ARG",
    "resource_exhausted": "UNAVAILABLE",
    "unavailable": "UNAVAILABLE",
    "cancelled": "CANCELLED",
    "not_found": "NOT_FOUND",
}


def triton_error(pb_utils: Any, error: StageError) -> Any:
    """A TritonError whose message starts with `[code]` so BLS callers recover the code."""
    code = getattr(pb_utils.TritonError, ERROR_CODES.get(error.code, "INTERNAL"))
    return pb_utils.TritonError(f"[{error.code}] {error.message}", code)


def parse_error_message(message: str) -> StageError:
    """Inverse of `triton_error` for a BLS caller; unknown formats become `internal`."""
    if message.startswith("[") and "] " in message:
        code, text = message[1:].split("] ", 1)
        return StageError(code, text)
    return StageError("internal", message)


class ResponseThread:
    def __init__(self, pb_utils: Any, name: str) -> None:
        self._pb = pb_utils
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, sender: Any, response: Any, flags: int) -> None:
        self._queue.put((sender, response, flags))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._send(*item)
            # Hold no sender while waiting: the stub frees a request's response factory, which
            # pins its model (unload waits for it), only when the sender object is destroyed.
            item = None

    @staticmethod
    def _send(sender: Any, response: Any, flags: int) -> None:
        try:
            sender.send(response, flags=flags) if response is not None else sender.send(flags=flags)
        except Exception as exc:  # a client that went away must not stop the others
            log.warning("response send failed: %r", exc)


class TritonSink:
    """ResponseSink over one Triton response sender."""

    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread,
                 encode: Callable[[Any], Any]) -> None:
        self._pb, self._sender, self._responses, self._encode = pb_utils, sender, responses, encode
        self._closed = False
        self._lock = threading.Lock()  # send/close may come from the engine and a stop path

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, result: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("send after FINAL")
            self._responses.put(self._sender, self._encode(result), 0)

    def close(self, error: StageError | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            final = self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            response = None if error is None else self._pb.InferenceResponse(error=triton_error(self._pb, error))
            self._responses.put(self._sender, response, final)
