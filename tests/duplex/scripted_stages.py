"""Scripted stage clients with real stream semantics, for orchestrator tests.

The Thinker speaks units `speak_from .. speak_from + reply_units - 1` of each epoch (the last
one ends the turn) and listens otherwise; the Talker returns 25 frames per condition (with
`talker_unfinished`, a first group whose stream then ends without its `finished` group, as a
stage that failed after its first frames answers its caller); Code2Wav returns 960 samples
per new frame. Stops are recorded; a request of a stopped id fails like
a real stage would. Fault injection: `fail_on[stage] = n` raises on that stage's n-th call.

`open` mirrors the request tables of the real engines: a first request (thinker seq 0, talker
condition_seq 0, code2wav chunk_seq 0) opens `(stage, request_id)` when it reaches the stage,
i.e. after its gate (`gate` for the Thinker, `talker_gate` for the Talker); a stop closes it,
and so does code2wav's last chunk. A stop that overtakes a held first request therefore leaves
that request open, exactly the race of docs/architecture.md edge case 1.
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import numpy as np

from backends.contracts.errors import StageError
from backends.contracts.messages import Code2WavAudio, TalkerCodes, ThinkerUnitResult
from backends.contracts.stage_clients import StageCallError
from backends.duplex.uplink import RawUplink

HIDDEN = 8
WAIT_S = 10.0


class ScriptedStages:
    def __init__(self, speak_from: int = 1, reply_units: int = 2, delay_s: float = 0.0) -> None:
        self.speak_from, self.reply_units, self.delay_s = speak_from, reply_units, delay_s
        self.units_seen: dict[str, int] = defaultdict(int)
        self.stops: list[tuple[str, str]] = []
        self.expected: list[tuple[str, int]] = []  # (announced request id, Talker calls before it)
        self.calls: dict[str, int] = defaultdict(int)
        self.fail_on: dict[str, int] = {}
        self.requests: list[object] = []
        self._lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.talker_gate = threading.Event()
        self.talker_gate.set()
        self.open: set[tuple[str, str]] = set()
        self.talker_unfinished = False

    def _arrive(self, stage: str, request_id: str, first: bool) -> None:
        if first:
            with self._lock:
                self.open.add((stage, request_id))

    def _count(self, stage: str) -> None:
        with self._lock:
            self.calls[stage] += 1
            if self.fail_on.get(stage) == self.calls[stage]:
                raise StageCallError(stage, StageError("internal", f"injected fault in {stage}"))

    def thinker(self, request):
        self._count("thinker")
        self.requests.append(request)
        self.gate.wait(10)
        self._arrive("thinker", request.request_id, request.seq == 0)
        if request.audio.size == 0:  # a setup append: the context is prefilled, no unit
            return
        with self._lock:  # one decision per append, on its last unit (as the real Thinker)
            self.units_seen[request.request_id] += request.audio.size // 16000
            index = self.units_seen[request.request_id] - 1
        yield self._unit(request, index)

    def _unit(self, request, index):
        speaking = self.speak_from <= index < self.speak_from + self.reply_units
        last = index == self.speak_from + self.reply_units - 1
        tokens = np.array([7, 8, 9], np.int32) if speaking else np.zeros(0, np.int32)
        return ThinkerUnitResult(
            request_id=request.request_id, seq=request.seq, unit_index=index,
            decision="speak" if speaking else "listen", token_ids=tokens, text=f"u{index} " if speaking else "",
            tts_token_ids=tokens, tts_hidden=np.ones((tokens.size, HIDDEN), np.float32),
            turn_start=index == self.speak_from, turn_end=last and speaking, segment_end=speaking)

    def talker(self, request):
        self._count("talker")
        self.requests.append(request)
        self.talker_gate.wait(10)
        self._arrive("talker", request.request_id, request.condition_seq == 0)
        finished = not self.talker_unfinished
        yield TalkerCodes(request.request_id, request.condition_seq, np.arange(25, dtype=np.int32) + 100, finished)

    def code2wav(self, request):
        self._count("code2wav")
        self.requests.append(request)
        self._arrive("code2wav", request.request_id, request.chunk_seq == 0)
        if request.last_chunk:
            with self._lock:
                self.open.discard(("code2wav", request.request_id))
        new = request.codes.size - request.num_left_context
        return [Code2WavAudio(request.request_id, request.chunk_seq, np.full(960 * new, 0.25, np.float32))]

    def expect_window(self, request_id):
        with self._lock:
            self.expected.append((request_id, self.calls["talker"]))

    def stop(self, stage, request_id):
        with self._lock:
            self.stops.append((stage, request_id))
            self.open.discard((stage, request_id))


class RecordingDownlink:
    def __init__(self) -> None:
        self.events: list = []
        self.closed = threading.Event()
        self.cancelled = threading.Event()  # set by a test: the client went away
        self.abandoned = False  # the session freed the transport (no END will come)
        self.moved_to: RecordingDownlink | None = None  # where later events go after a move
        self._lock = threading.Lock()

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def abandon(self) -> None:
        self.abandoned = True

    def send(self, event) -> None:
        with self._lock:
            if self.moved_to is not None:
                return self.moved_to.send(event)
            if self.closed.is_set():
                raise RuntimeError("send after FINAL")
            self.events.append(event)

    def close(self) -> None:
        with self._lock:
            if self.moved_to is not None:
                return self.moved_to.close()
            if self.closed.is_set():
                raise RuntimeError("FINAL sent twice")
            self.closed.set()

    def move(self, to, notice) -> bool:
        """The notice and the FINAL here; every later event and the close go to `to`."""
        with self._lock:
            if self.moved_to is not None:
                return self.moved_to.move(to, notice)
            if self.closed.is_set():
                return False
            self.events.append(notice)
            self.closed.set()
            self.moved_to = to
            return True

    def types(self) -> list[str]:
        return [e.type for e in self.events]


class RecordingReply:
    def __init__(self) -> None:
        self.result = None

    def ok(self) -> None:
        assert self.result is None, "answered twice"
        self.result = "ok"

    def fail(self, error) -> None:
        assert self.result is None, "answered twice"
        self.result = error


def send(manager, sid, samples=0, start=False, end=False, downlink=None, **params):
    """One uplink message of `samples` silent samples into a SessionManager -> (downlink, reply)."""
    downlink = downlink or RecordingDownlink()
    reply = RecordingReply()
    raw = RawUplink(sid, start, end, np.zeros(samples, np.int16), None, json.dumps(params))
    manager.handle(raw, reply, lambda: downlink)
    return downlink, reply


class ManualClock:
    """A session clock that moves only when the test moves it: idle, grace and stall limits
    then follow the test's steps, not how fast a loaded machine runs the threads."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class ReaperSweeps:
    """A SessionManager observer: the manager calls it after each reaper sweep, so a test can
    wait for sweeps to have happened instead of sleeping for a guess of their period."""

    def __init__(self) -> None:
        self.count = 0
        self.last: dict[str, int] | None = None
        self._changed = threading.Condition()

    def __call__(self, stats: dict[str, int]) -> None:
        with self._changed:
            self.count += 1
            self.last = stats
            self._changed.notify_all()

    def wait_more(self, sweeps: int = 2) -> None:
        """Wait for `sweeps` more sweeps to end; the second of two began after this call."""
        with self._changed:
            target = self.count + sweeps
            if not self._changed.wait_for(lambda: self.count >= target, WAIT_S):
                raise AssertionError(f"the reaper did not sweep {sweeps} times in {WAIT_S} s")


def wait_finished(manager, downlink: RecordingDownlink, what: str) -> None:
    """The session's downlink FINAL, then the session gone from the manager: a session sends
    its FINAL first and frees its transport and admission slot just after, so a check of those
    right after the FINAL would race the session's own thread."""
    wait_for(downlink.closed.is_set, what)
    wait_for(lambda: manager.num_sessions == 0, f"{what}: the session forgotten")


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")
