"""Typed downlink events of the `duplex` model, parsed from the `EVENT` JSON of each response.

Known event types are checked strictly (a missing or mistyped field raises `EventParseError`
naming it), because a server that breaks the contract should fail loudly in tests rather than
yield half-filled events. Unknown types are kept as `UnknownEvent` so that a newer server
does not break an older client. `RequestFailed` is the one event not sent as JSON: it stands
for a request that Triton answered with an in-band error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

import numpy as np

RESPONSE_STATUSES = ("completed", "cancelled", "failed")
REQUEST_FAILED_TYPE = "client.request_failed"

JsonObject: TypeAlias = Mapping[str, Any]


class EventParseError(ValueError):
    """An `EVENT` payload that does not follow the client contract."""


@dataclass(frozen=True, slots=True)
class EventHeader:
    """The fields every JSON event has."""

    type: str
    session_id: str | int
    received_s: float  # client monotonic arrival time
    raw: JsonObject = field(repr=False)  # the whole JSON object, unknown fields included


@dataclass(frozen=True, slots=True)
class SessionCreated(EventHeader):
    """The downlink is open; capabilities, if any, are in `raw`."""


@dataclass(frozen=True, slots=True)
class ResponseCreated(EventHeader):
    response_id: str
    turn_id: int | None


@dataclass(frozen=True, slots=True)
class ResponseSpeak(EventHeader):
    response_id: str | None
    turn_id: int | None


@dataclass(frozen=True, slots=True)
class ResponseListen(EventHeader):
    response_id: str | None
    turn_id: int | None


@dataclass(frozen=True, slots=True)
class TextDelta(EventHeader):
    """Transcript of one speak unit, sent before its audio (`response.text.delta`)."""

    response_id: str
    turn_id: int | None
    text: str
    ttft_ms: float | None  # server-side TTFT, on the first text of a response only


# eq=False: the int16 payload would make `==` ambiguous.
@dataclass(frozen=True, slots=True, eq=False)
class AudioDelta(EventHeader):
    response_id: str
    turn_id: int
    text: str  # transcript of this unit, may be empty
    audio_ms: float  # cumulative audio of the response including this chunk
    ttfp_ms: float | None  # server-side TTFP, on the first chunk of a response only
    audio: np.ndarray = field(repr=False)  # [num_samples] int16, 24 kHz mono


@dataclass(frozen=True, slots=True)
class ResponseDone(EventHeader):
    response_id: str | None  # None: the response opened last
    status: str  # one of RESPONSE_STATUSES


@dataclass(frozen=True, slots=True)
class ErrorEvent(EventHeader):
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class SessionClosed(EventHeader):
    reason: str | None


@dataclass(frozen=True, slots=True)
class UnknownEvent(EventHeader):
    """A type this client does not know (a newer server); everything is in `raw`."""


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """Triton answered a request of this session with an error instead of a response."""

    type: str
    session_id: str | int
    received_s: float
    message: str


DuplexEvent: TypeAlias = (
    SessionCreated
    | ResponseCreated
    | ResponseSpeak
    | ResponseListen
    | TextDelta
    | AudioDelta
    | ResponseDone
    | ErrorEvent
    | SessionClosed
    | UnknownEvent
    | RequestFailed
)


def is_error(event: DuplexEvent) -> bool:
    """True for events that mean something went wrong (the CLI's exit code follows them)."""
    if isinstance(event, (ErrorEvent, RequestFailed)):
        return True
    return isinstance(event, ResponseDone) and event.status == "failed"


def parse_event(
    payload: str | bytes, *, received_s: float = 0.0, audio: np.ndarray | None = None
) -> DuplexEvent:
    """Parse one `EVENT` JSON object; `audio` is the response's AUDIO_OUT, [n] int16, if any."""
    obj = _load_object(payload)
    event_type = _required(obj, "type", str, "event")
    session_id = _required(obj, "session_id", (str, int), event_type)
    if event_type != "response.audio.delta" and audio is not None:
        raise EventParseError(
            f"AUDIO_OUT is only allowed on response.audio.delta, got it on {event_type!r}"
        )
    header = (event_type, session_id, received_s, MappingProxyType(dict(obj)))
    parser = _PARSERS.get(event_type)
    if parser is None:
        return UnknownEvent(*header)
    return parser(header, obj, audio)


def _load_object(payload: str | bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventParseError(f"EVENT is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise EventParseError(f"EVENT must be a JSON object, got {type(obj).__name__}")
    return obj


def _required(obj: JsonObject, key: str, kind: type | tuple[type, ...], event_type: str) -> Any:
    if key not in obj:
        raise EventParseError(f"{event_type!r} event is missing field {key!r}")
    return _checked(obj[key], key, kind, event_type)


def _optional(obj: JsonObject, key: str, kind: type | tuple[type, ...], event_type: str) -> Any:
    value = obj.get(key)
    return None if value is None else _checked(value, key, kind, event_type)


def _checked(value: Any, key: str, kind: type | tuple[type, ...], event_type: str) -> Any:
    # bool is an int subclass in Python; a JSON true is never a valid id or duration.
    if isinstance(value, bool) or not isinstance(value, kind):
        raise EventParseError(f"{event_type!r} field {key!r} has the wrong type: {value!r}")
    return value


def _parse_created(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> ResponseCreated:
    etype = header[0]
    return ResponseCreated(
        *header, _required(obj, "response_id", str, etype), _optional(obj, "turn_id", int, etype)
    )


def _parse_speak(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> ResponseSpeak:
    etype = header[0]
    return ResponseSpeak(
        *header, _optional(obj, "response_id", str, etype), _optional(obj, "turn_id", int, etype)
    )


def _parse_listen(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> ResponseListen:
    etype = header[0]
    return ResponseListen(
        *header, _optional(obj, "response_id", str, etype), _optional(obj, "turn_id", int, etype)
    )


def _parse_text(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> TextDelta:
    etype = header[0]
    ttft_ms = _optional(obj, "ttft_ms", (int, float), etype)
    return TextDelta(
        *header,
        response_id=_required(obj, "response_id", str, etype),
        turn_id=_optional(obj, "turn_id", int, etype),
        text=_required(obj, "text", str, etype),
        ttft_ms=None if ttft_ms is None else float(ttft_ms),
    )


def _parse_delta(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> AudioDelta:
    etype = header[0]
    if audio is None:
        raise EventParseError("response.audio.delta arrived without an AUDIO_OUT tensor")
    if audio.dtype != np.int16 or audio.ndim != 1:
        raise EventParseError(f"AUDIO_OUT must be [n] int16, got {audio.dtype} {audio.shape}")
    ttfp_ms = _optional(obj, "ttfp_ms", (int, float), etype)
    return AudioDelta(
        *header,
        response_id=_required(obj, "response_id", str, etype),
        turn_id=_required(obj, "turn_id", int, etype),
        text=_required(obj, "text", str, etype),
        audio_ms=float(_required(obj, "audio_ms", (int, float), etype)),
        ttfp_ms=None if ttfp_ms is None else float(ttfp_ms),
        audio=audio,
    )


def _parse_done(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> ResponseDone:
    etype = header[0]
    status = _required(obj, "status", str, etype)
    if status not in RESPONSE_STATUSES:
        raise EventParseError(
            f"response.done status must be one of {RESPONSE_STATUSES}, got {status!r}"
        )
    return ResponseDone(*header, _optional(obj, "response_id", str, etype), status)


def _parse_error(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> ErrorEvent:
    etype = header[0]
    code = _required(obj, "code", (str, int), etype)
    return ErrorEvent(*header, str(code), _required(obj, "message", str, etype))


def _parse_closed(header: tuple, obj: JsonObject, audio: np.ndarray | None) -> SessionClosed:
    return SessionClosed(*header, _optional(obj, "reason", str, header[0]))


def _parse_session_created(
    header: tuple, obj: JsonObject, audio: np.ndarray | None
) -> SessionCreated:
    return SessionCreated(*header)


_Parser: TypeAlias = Callable[[tuple, JsonObject, "np.ndarray | None"], DuplexEvent]
_PARSERS: Mapping[str, _Parser] = MappingProxyType(
    {
        "session.created": _parse_session_created,
        "response.created": _parse_created,
        "response.speak": _parse_speak,
        "response.listen": _parse_listen,
        "response.text.delta": _parse_text,
        "response.audio.delta": _parse_delta,
        "response.done": _parse_done,
        "error": _parse_error,
        "session.closed": _parse_closed,
    }
)
