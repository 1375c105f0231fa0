"""Sessions by sequence id: routing of uplink requests, admission, and the reaper.

Triton never tells a model about idle sequences (triton_notes.md section 3), so the reaper
here closes a session that sent nothing for `idle_timeout_s` with `session.closed` reason
`idle`, before Triton's own (longer) sequence timeout frees the slot. A session that sent END
is finishing its last audio and gets `CLOSING_GRACE` times as long. The same sweep, every `REAP_PERIOD_S`, closes
the sessions whose client is gone (the START request's stream was cancelled: the client
stopped its stream or disconnected) with reason `client_gone`, and hands `stats()` to an
optional observer (the resource gauges: this thread is the only one that updates them).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from backends.duplex import events as ev
from backends.duplex.errors import INTERNAL, NOT_FOUND, RESOURCE_EXHAUSTED, SESSION_EXISTS, DuplexError
from backends.duplex.session import (
    CLOSE_CLIENT_GONE, CLOSE_IDLE, CLOSE_SHUTDOWN, Downlink, Session, SessionConfig,
)
from backends.duplex.stage_clients import StageClients
from backends.duplex.unit_buffer import SAMPLE_RATE
from backends.duplex.uplink import RawUplink, Uplink, parse_uplink

log = logging.getLogger(__name__)

REAP_PERIOD_S = 0.5  # client-gone detection delay; one cancellation check per session per sweep
CLOSING_GRACE = 3  # idle limit factor after END: its flush may outlast a short idle timeout


class UplinkReply(Protocol):
    """The answer to a non-START uplink request: an empty FINAL, or an error + FINAL."""

    def ok(self) -> None: ...

    def fail(self, error: DuplexError) -> None: ...


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    max_sessions: int = 4
    idle_timeout_s: float = 60.0
    max_append_ms: int = 10000
    session: SessionConfig = SessionConfig()

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be positive, got {self.idle_timeout_s}")

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
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="duplex-reaper", daemon=True)
        self._reaper.start()

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def stats(self) -> dict[str, int]:
        """What the orchestrator holds: open sessions and threads (two per session)."""
        return {"sessions": self.num_sessions, "threads": threading.active_count()}

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
        self._apply(session, uplink)
        reply.ok()

    def _reject(self, raw: RawUplink, exc: DuplexError, reply: UplinkReply,
                open_downlink: Callable[[], Downlink]) -> None:
        message = f"session {raw.session_id!r}: {exc.message}"
        if raw.is_start:
            _refuse_start(open_downlink(), raw.session_id, exc.code, message)
            return
        reply.fail(DuplexError(exc.code, message))
        session = self._get(raw.session_id)
        if session is not None:  # the session lives on; its downlink hears why a request failed
            session.emit(ev.ERROR, code=exc.code, message=message)

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
            _refuse_start(open_downlink(), sid, *refusal)
            return
        session.start()
        self._apply(session, uplink)

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
        if uplink.action == "cancel":
            session.cancel()
        session.append(uplink.audio, commit=uplink.action == "commit")
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
            for session, reason in self._doomed():
                log.info("session %s closed: %s", session.session_id, reason)
                session.close(reason)
            if self._observer is not None:
                try:
                    self._observer(self.stats())
                except Exception as exc:  # gauges are best effort; the reaper must go on
                    log.warning("session stats observer failed: %r", exc)

    def _doomed(self) -> list[tuple[Session, str]]:
        now = self._clock()
        with self._lock:
            sessions = list(self._sessions.values())
        doomed = []
        for session in sessions:  # outside the lock: each check is an IPC round trip
            if session.client_gone():
                doomed.append((session, CLOSE_CLIENT_GONE))
            elif now - session.last_activity > self.config.idle_timeout_s * (
                    CLOSING_GRACE if session.is_closing else 1):
                doomed.append((session, CLOSE_IDLE))
        return doomed

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.close(CLOSE_SHUTDOWN)
        self._reaper.join(5.0)


def _refuse_start(downlink: Downlink, sid: str, code: str, message: str) -> None:
    downlink.send(ev.ServerEvent(ev.ERROR, sid, {"code": code, "message": message}))
    downlink.close()


