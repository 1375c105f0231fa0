"""Sessions by sequence id: routing of uplink requests, admission, and the reaper.

Admission refuses a START over `max_sessions` at once; every refused START frees its Triton
sequence before it is answered (refusals.py). Each append passes the session's uplink bound
(uplink_pace.py) or fails alone, the session going on.

Triton never tells a model about idle sequences (docs/triton_behaviours.md#sequence-batcher), so
the reaper here closes a session that sent nothing for `idle_timeout_s` with `session.closed`
reason `idle`, before Triton's own (longer) sequence timeout frees the slot. A session that sent END
is finishing its last audio and gets `CLOSING_GRACE` times as long. The same sweep, every
`REAP_PERIOD_S`, closes the sessions whose client is gone (the START request's stream was
cancelled: the client stopped its stream or disconnected) with reason `client_gone`; closes with
`error` `stage_timeout` a session that waited `stage_timeout_s` on a stage without an answer;
finishes the sessions still stuck `STUCK_CLOSE_S` after their close (their threads, blocked in a
call that never returns, count as `stranded_threads`), and hands `stats()` to an optional observer
(the resource gauges: this thread is the only one that updates them).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from backends.contracts.errors import StageError
from backends.contracts.stage_clients import StageClients
from backends.duplex import close_reasons as why
from backends.duplex import events as ev
from backends.duplex.errors import INTERNAL, NOT_FOUND, RESOURCE_EXHAUSTED, SESSION_EXISTS, DuplexError
from backends.duplex.downlink import Downlink
from backends.duplex.refusals import Refusal, Refusals
from backends.duplex.session import Session, SessionConfig
from backends.duplex.unit_buffer import SAMPLE_RATE
from backends.duplex.uplink import MOVE_DOWNLINK, RawUplink, Uplink, parse_uplink

log = logging.getLogger(__name__)

REAP_PERIOD_S = 0.5  # client-gone detection delay; one cancellation check per session per sweep
CLOSING_GRACE = 3  # idle limit factor after END: its flush may outlast a short idle timeout
STUCK_CLOSE_S = 10.0  # a closed session whose loops have not ended by then is finished anyway


class UplinkReply(Protocol):
    """The answer to a non-START uplink request: an empty FINAL, or an error + FINAL."""

    def ok(self) -> None: ...

    def fail(self, error: DuplexError) -> None: ...


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    max_sessions: int = 4
    idle_timeout_s: float = 60.0
    max_append_ms: int = 10000
    stage_timeout_s: float = 30.0  # a stage call with no answer for this long fails the session
    session: SessionConfig = SessionConfig()

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be positive, got {self.idle_timeout_s}")
        if self.stage_timeout_s <= 0:
            raise ValueError(f"stage_timeout_s must be positive, got {self.stage_timeout_s}")

    @property
    def max_append_samples(self) -> int:
        return self.max_append_ms * SAMPLE_RATE // 1000


class SessionManager:
    def __init__(self, config: ManagerConfig, stages: StageClients,
                 clock: Callable[[], float] = time.monotonic,
                 observer: Callable[[dict[str, int]], None] | None = None) -> None:
        self.config = config
        self._stages = stages
        self._clock = clock
        self._observer = observer
        self._lock = threading.Lock()  # guards _sessions
        self._sessions: dict[str, Session] = {}
        self._stranded: list[Session] = []  # force-finished, a thread still in a stage call
        self._stopping = threading.Event()
        self._refusals = Refusals()
        self._reaper = threading.Thread(target=self._reap_loop, name="duplex-reaper", daemon=True)
        self._reaper.start()

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def stats(self) -> dict[str, int]:
        """What the orchestrator holds: open sessions, their live worker threads (two each),
        the threads of force-finished sessions still blocked in a stage call, all threads of
        the process (stage streams and other machinery included), and the uplink audio (ms)
        the open sessions hold that the Thinker has not taken yet."""
        with self._lock:
            held = sum(s.intake.held_samples for s in self._sessions.values())
            return {"sessions": len(self._sessions),
                    "session_threads": sum(s.live_threads() for s in self._sessions.values()),
                    "stranded_threads": sum(s.live_threads() for s in self._stranded),
                    "threads": threading.active_count(),
                    "uplink_audio_ms": held * 1000 // SAMPLE_RATE}

    def handle(self, raw: RawUplink, reply: UplinkReply, open_downlink: Callable[[], Downlink]) -> None:
        """Route one uplink request. START requests become the session downlink."""
        try:
            self._handle(raw, reply, open_downlink)
        except Exception as exc:  # a bug must still answer the request, and only this one
            log.exception("uplink of session %s failed", raw.session_id)
            self._reject(raw, DuplexError(INTERNAL, f"internal error: {type(exc).__name__}"), reply, open_downlink)

    def _handle(self, raw: RawUplink, reply: UplinkReply, open_downlink: Callable[[], Downlink]) -> None:
        try:
            uplink = parse_uplink(raw, self.config.max_append_samples)
        except DuplexError as exc:
            self._reject(raw, exc, reply, open_downlink)
            return
        if uplink.is_start:
            self._start(uplink, open_downlink)
            return
        session = self._get(uplink.session_id)
        if session is None:
            reply.fail(DuplexError(NOT_FOUND, f"session {uplink.session_id!r} is not open: a session starts with "
                                              "a START request (it may have been closed or reaped)"))
            return
        if uplink.action == MOVE_DOWNLINK:
            self._move_downlink(session, reply, open_downlink)
            return
        try:
            self._apply(session, uplink)
        except DuplexError as exc:  # past the uplink bound
            self._reject(raw, exc, reply, open_downlink)
            return
        reply.ok()

    @staticmethod
    def _move_downlink(session: Session, reply: UplinkReply, open_downlink: Callable[[], Downlink]) -> None:
        """The request becomes the session's downlink: it is answered by the session's events."""
        notice = ev.ServerEvent(ev.DOWNLINK_MOVED, session.session_id, {})
        if not session.downlink.move(open_downlink(), notice):
            reply.fail(DuplexError(NOT_FOUND, f"session {session.session_id!r} is closing: its downlink "
                                              "cannot move"))

    def _reject(self, raw: RawUplink, exc: DuplexError, reply: UplinkReply,
                open_downlink: Callable[[], Downlink]) -> None:
        message = f"session {raw.session_id!r}: {exc.message}"
        if raw.is_start:
            self._refuse_start(open_downlink, raw.session_id, raw.is_end, exc.code, message)
            return
        reply.fail(DuplexError(exc.code, message))
        session = self._get(raw.session_id)
        if session is not None:  # the session lives on; its downlink hears why a request failed
            session.emit(ev.ERROR, code=exc.code, message=message)
            if raw.is_end:  # Triton ended the sequence with this request, failed or not
                session.end()

    def _refuse_start(self, open_downlink: Callable[[], Downlink], sid: str, is_end: bool, code: str,
                      message: str) -> None:
        """`error` + FINAL on the START's downlink. The sequence the START opened is freed first
        (refusals.py), unless the START also carried END (that ended it) or the sequence is an
        open session's: a START for a sequence in progress joins it in Triton."""
        with self._lock:
            session = self._sessions.get(sid)
            release = not is_end and (session is None or not session.sequence_open)
        event = ev.ServerEvent(ev.ERROR, sid, {"code": code, "message": message})
        self._refusals.refuse(Refusal(open_downlink(), event, release))

    def _start(self, uplink: Uplink, open_downlink: Callable[[], Downlink]) -> None:
        sid = uplink.session_id
        with self._lock:
            refusal = self._admission_refusal(sid)
            if refusal is None:
                assert uplink.options is not None  # parse_uplink sets it on START
                session = Session(sid, uplink.options, open_downlink(), self._stages, self.config.session,
                                  self._forget, self._clock)
                self._sessions[sid] = session
        if refusal is not None:
            self._refuse_start(open_downlink, sid, uplink.is_end, *refusal)
            return
        session.start()
        try:
            self._apply(session, uplink)
        except DuplexError as exc:  # START audio past the uplink bound: the session goes on without it
            session.emit(ev.ERROR, code=exc.code, message=f"session {sid!r}: {exc.message}")

    def _admission_refusal(self, sid: str) -> tuple[str, str] | None:
        if self._stopping.is_set():
            return RESOURCE_EXHAUSTED, "the server is shutting down"
        if sid in self._sessions:
            return SESSION_EXISTS, f"session {sid!r} is already open"
        if len(self._sessions) >= self.config.max_sessions:
            return RESOURCE_EXHAUSTED, (f"session {sid!r} refused: {self.config.max_sessions} sessions are open, "
                                        "the configured limit (retry later)")
        return None

    def _apply(self, session: Session, uplink: Uplink) -> None:
        """Raises DuplexError when the audio is past the uplink bound; an END ends anyway."""
        if uplink.action == "cancel":
            session.cancel()
        try:
            session.append(uplink.audio, commit=uplink.action == "commit")
        finally:
            if uplink.is_end:
                session.end()

    def _get(self, sid: str) -> Session | None:
        with self._lock:
            return self._sessions.get(sid)

    def _forget(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.session_id) is session:
                del self._sessions[session.session_id]

    def _reap_loop(self) -> None:
        period = min(REAP_PERIOD_S, self.config.idle_timeout_s / 4)
        while not self._stopping.wait(period):
            for session, reason, error in self._doomed():
                log.info("session %s closed: %s", session.session_id, reason)
                session.close(reason, error)
            self._finish_stuck()
            if self._observer is not None:
                try:
                    self._observer(self.stats())
                except Exception as exc:  # gauges are best effort; the reaper must go on
                    log.warning("session stats observer failed: %r", exc)

    def _doomed(self) -> list[tuple[Session, str, StageError | None]]:
        now, limit = self._clock(), self.config.stage_timeout_s
        with self._lock:
            sessions = [s for s in self._sessions.values() if s.aborted_at is None]
        doomed: list[tuple[Session, str, StageError | None]] = []
        for session in sessions:  # outside the lock: each check is an IPC round trip
            if session.client_gone():
                doomed.append((session, why.CLIENT_GONE, None))
            elif session.stall.stalled_s() > limit:
                doomed.append((session, why.ERROR, StageError(
                    "stage_timeout", f"session {session.session_id!r}: no answer from a stage for {limit:.0f} s")))
            elif now - session.last_activity > self.config.idle_timeout_s * (
                    CLOSING_GRACE if session.is_closing else 1):
                doomed.append((session, why.IDLE, None))
        return doomed

    def _finish_stuck(self) -> None:
        now = self._clock()
        with self._lock:
            stuck = [s for s in self._sessions.values()
                     if s.aborted_at is not None and now - s.aborted_at > STUCK_CLOSE_S]
            self._stranded = [s for s in self._stranded if s.live_threads()]
        for session in stuck:
            log.warning("session %s: a stage call has not returned %.0f s after the close; finishing it",
                        session.session_id, STUCK_CLOSE_S)
            session.force_finish()
            with self._lock:
                self._stranded.append(session)

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.close(why.SHUTDOWN)
        self._refusals.shutdown()
        self._reaper.join(5.0)


