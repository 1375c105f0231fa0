"""One raw duplex session on its own gRPC stream, for lifecycle tests: send START, audio,
`cancel`, END, or drop the stream, and read the downlink events in order.

Built on conftest's RawStream. Downlink responses (the START request's) become `events`
(JSON dicts, audio attached as "_audio"); the answers to the other requests are kept apart in
`failures` when they carry an error. `close()` waits for every request's FINAL before it
releases the stream: cancelling an END still on its way would leave Triton's sequence open.
"""
from __future__ import annotations

import queue
import time
import uuid
from typing import Callable

import numpy as np

from conftest import RawStream

from client.stream_close import stop_stream

UNIT = 16000  # samples per 1 s unit at 16 kHz
WAIT_S = 60.0
EventTest = Callable[[dict], bool]


class SessionProbe:
    def __init__(self, url: str, session_id: str | None = None) -> None:
        self.stream = RawStream(url, session_id or f"p-{uuid.uuid4().hex[:10]}")
        self.events: list[dict] = []
        self.failures: list[str] = []  # errors of uplink requests (not the downlink)
        self.downlink_closed = False
        self._unanswered: list[str] = []  # uplink request ids without their FINAL, oldest first
        self._dropped = False

    @property
    def session_id(self) -> str:
        return self.stream.session_id

    @property
    def dropped(self) -> bool:
        return self._dropped

    def start(self, audio: np.ndarray | None = None, **params: object) -> None:
        self.stream.send(audio, start=True, **params)

    def append(self, audio: np.ndarray, **params: object) -> None:
        self._unanswered.append(self.stream.send(audio, **params))

    def cancel(self) -> None:
        self._unanswered.append(self.stream.send(action="cancel"))

    def end(self) -> None:
        self._unanswered.append(self.stream.send(end=True))

    def drop(self) -> None:
        """The client goes away mid-session: cancel the stream, send no END."""
        self._dropped = True
        stop_stream(self.stream.client, cancel=True)
        self.stream.client.close()

    def close(self) -> None:
        """END if still open, wait for every FINAL, then release the client (test teardown).
        No END after a refused START: the server freed its sequence before the refusal."""
        if self._dropped:
            return
        if self.stream.start_request_id is not None and not self.stream.ended and self._was_created():
            self.end()
        deadline = time.monotonic() + 15
        try:
            while not self.downlink_closed or self._unanswered:
                self._pump(deadline, "the last FINALs")
        except AssertionError:
            pass
        self.drop()

    def _was_created(self) -> bool:
        try:
            first = self.wait_for(lambda e: True, "the answer to START", timeout_s=15)
        except AssertionError:
            return False
        return first["type"] == "session.created"

    def wait_answered(self, timeout_s: float = WAIT_S) -> None:
        """Until every uplink request sent so far has its FINAL (errors land in `failures`)."""
        deadline = time.monotonic() + timeout_s
        while self._unanswered:
            self._pump(deadline, "the uplink FINALs")

    def wait_for(self, test: EventTest, what: str, timeout_s: float = WAIT_S) -> dict:
        """The first event (already received or arriving) that passes `test`."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for event in self.events[seen:]:
                if test(event):
                    return event
            seen = len(self.events)
            if self.downlink_closed:
                raise AssertionError(f"{self.session_id}: downlink closed before {what}: {self.types()}")
            self._pump(deadline, what)

    def wait_type(self, event_type: str, timeout_s: float = WAIT_S) -> dict:
        return self.wait_for(lambda e: e["type"] == event_type, event_type, timeout_s)

    def wait_closed(self, timeout_s: float = WAIT_S) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while not self.downlink_closed:
            self._pump(deadline, "the downlink FINAL")
        return self.events

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    def audio_of(self, response_id: str) -> list[np.ndarray]:
        return [e["_audio"] for e in self.events if e["type"] == "response.audio.delta"
                and e["response_id"] == response_id]

    def _pump(self, deadline: float, what: str) -> None:
        try:
            item = self.stream.received.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            raise AssertionError(f"{self.session_id}: no {what} in time; events so far {self.types()}") from None
        if item.request_id == self.stream.start_request_id and item.error is None:
            if item.event is not None:
                self.events.append({**item.event, "_audio": item.audio})
            self.downlink_closed = self.downlink_closed or item.final
            return
        if item.error is not None:
            self.failures.append(item.error)
        # tritonclient 2.51 drops the id of in-band errors: such an answer is the oldest one due
        answered = item.request_id if item.request_id in self._unanswered else None
        if answered is None and item.error is not None and self._unanswered:
            answered = self._unanswered[0]
        if answered is not None and item.final:
            self._unanswered.remove(answered)


def speech_units(num_units: int, seed: int = 0) -> np.ndarray:
    """[num_units * 16000] int16: loud noise the Thinker's speech detector takes for speech."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(num_units * UNIT) * 6000).clip(-32767, 32767).astype(np.int16)


def silence_units(num_units: int) -> np.ndarray:
    return np.zeros(num_units * UNIT, np.int16)


class ProbePool:
    """Makes probes on one server and closes them all (a test fixture's teardown)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._made: list[SessionProbe] = []

    def __call__(self, session_id: str | None = None) -> SessionProbe:
        self._made.append(SessionProbe(self._url, session_id))
        return self._made[-1]

    def close_all(self) -> None:
        for probe in self._made:
            probe.close()
