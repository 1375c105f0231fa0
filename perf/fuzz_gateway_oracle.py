"""What a case of perf/fuzz_gateway_inputs.py should get, read from docs/gateway.md (the gateway's
own checks) and from the client contract (START parameters: perf/fuzz_oracle.py's rules), apart
from the gateway's code so that a check too lax or too strict shows up.

An `Expectation` is either a refusal at the handshake (an HTTP status) or, for an accepted
connection, the error codes the connection must get, in order, before its session is closed.
"""
from __future__ import annotations

from dataclasses import dataclass

from perf.fuzz_gateway_inputs import DEMO, RATE_SLACK_S, REALTIME, Frame, GatewayCase
from perf.fuzz_oracle import _params_valid

# The reply-shape knobs the fuzz gateway gives every session (--session-default).
SESSION_DEFAULTS = {"reply_units": 2, "reply_tokens_per_unit": 3}
MAX_MESSAGE_BYTES = 262144  # the fuzz gateway's --max-message-bytes; past 4 times it the socket closes (1009)
SERVER_REFUSAL = "invalid_argument"  # the server's code for a START it refuses (docs/duplex_contract.md)
GATEWAY_CODES = ("invalid_json", "invalid_event", "unknown_event_type", "session_not_initialized", "invalid_audio",
                 "message_too_large", "input_rate_exceeded", "video_not_supported", "queue_full", "init_timeout",
                 "upstream_unavailable")
SERVER_CODES = ("invalid_argument", "resource_exhausted", "stage_failed", "session_exists", "session_not_found")
DOCUMENTED = GATEWAY_CODES + SERVER_CODES
ANY_STATUS = -1  # either accepted or refused (an id the router may not match)


@dataclass(frozen=True)
class Expectation:
    status: int | None = None  # an HTTP refusal; None: accepted; ANY_STATUS: either
    codes: tuple[str, ...] = ()
    dropped: bool = False  # the gateway closes the connection (a frame past its hard limit)


def expect(case: GatewayCase) -> Expectation:
    status = _handshake(case)
    if status not in (None, ANY_STATUS):
        return Expectation(status)
    if case.protocol == REALTIME and case.handshake.mode not in ("audio", "omitted"):
        return Expectation(status, ("video_not_supported",))
    walk = _Walk(case.protocol)
    for frame in case.frames:
        if walk.over:
            break
        walk.step(frame)
    return Expectation(status, tuple(walk.codes), walk.dropped)


def _handshake(case: GatewayCase) -> int | None:
    shake = case.handshake
    if shake.origin == "foreign":
        return 403
    if shake.key in ("missing", "wrong"):
        return 401
    if case.protocol == DEMO and "%2F" in shake.path_id:
        return ANY_STATUS
    return None


class _Walk:
    """The connection's state as the documentation describes it, one frame at a time."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.codes: list[str] = []
        self.initialized = self.over = self.dropped = False
        self.audio_s = 0.0

    def error(self, code: str, ends_session: bool = False) -> None:
        self.codes.append(code)
        self.over = self.over or ends_session or self.protocol == REALTIME

    def step(self, frame: Frame) -> None:
        effect = frame.effect
        if effect == "binary":
            effect = "bad" if frame.code else "init"
        size = len(frame.data.encode("utf-8", "surrogatepass"))
        if size > 4 * MAX_MESSAGE_BYTES:
            effect = "dropped"
        elif size > MAX_MESSAGE_BYTES:
            effect, frame = "bad", Frame("bad", "", code="message_too_large")
        if effect == "dropped":
            self.over = self.dropped = True
        elif effect == "bad":
            self.error(frame.code)
        elif effect == "close":
            self.over = True
        elif not self.initialized and effect in ("append", "noop"):
            self.error("session_not_initialized")
        elif effect == "append":
            self._append(frame.seconds)
        elif effect == "init":
            self._init(frame)

    def _append(self, seconds: float) -> None:
        if self.audio_s + seconds > RATE_SLACK_S:
            self.error("input_rate_exceeded")  # a refused append does not count as sent
        else:
            self.audio_s += seconds

    def _init(self, frame: Frame) -> None:
        if self.initialized:
            self.error("invalid_event")
            return
        code = init_code(self.protocol, frame)
        if code == SERVER_REFUSAL:
            self.error(code, ends_session=True)
        elif code:
            self.error(code)
        else:
            self.initialized = True


def init_code(protocol: str, frame: Frame) -> str:
    """The code a session.init / prepare gets, "" when the session is created."""
    if frame.code:
        return frame.code
    if frame.voice == "bad":
        return "invalid_audio"
    if any(isinstance(value, str) and "\x00" in value for _, value in frame.params):
        return "invalid_event"  # Triton would cut a string parameter at its first NUL: refused, not cut
    params = dict(frame.params)
    if frame.voice == "short" or not _params_valid({**SESSION_DEFAULTS, **params}, True):
        return SERVER_REFUSAL
    return ""
