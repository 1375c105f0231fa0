"""Tests for client/events.py.

Strategy: literal JSON payloads for every event type of the contract
(docs/duplex_contract.md#downlink-the-start-requests-responses) parse into the expected typed
fields; every way a payload can break the contract (missing or mistyped field, audio on the wrong
event, bad JSON) raises EventParseError naming the problem; unknown types survive as UnknownEvent.
"""

import json

import numpy as np
import pytest

from client.events import (
    AudioDelta,
    ErrorEvent,
    EventParseError,
    RequestFailed,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ResponseSpeak,
    SessionClosed,
    SessionCreated,
    TextDelta,
    UnknownEvent,
    is_error,
    parse_event,
)

AUDIO = np.arange(480, dtype=np.int16)  # 20 ms at 24 kHz


def payload(**fields: object) -> str:
    return json.dumps({"session_id": "s1", **fields})


def test_session_created_keeps_header_and_raw_fields():
    event = parse_event(payload(type="session.created", chunk_period_ms=1000), received_s=2.5)
    assert isinstance(event, SessionCreated)
    assert (event.type, event.session_id, event.received_s) == ("session.created", "s1", 2.5)
    assert event.raw["chunk_period_ms"] == 1000


def test_audio_delta_fields():
    text = payload(
        type="response.audio.delta", response_id="r1", turn_id=3, text="hi", audio_ms=1000,
        ttfp_ms=412.5,
    )
    event = parse_event(text.encode(), received_s=1.0, audio=AUDIO)
    assert isinstance(event, AudioDelta)
    assert (event.response_id, event.turn_id, event.text) == ("r1", 3, "hi")
    assert (event.audio_ms, event.ttfp_ms) == (1000.0, 412.5)
    assert event.audio is AUDIO


def test_audio_delta_without_ttfp_is_a_later_chunk():
    text = payload(type="response.audio.delta", response_id="r1", turn_id=0, text="", audio_ms=2000)
    assert parse_event(text, audio=AUDIO).ttfp_ms is None


@pytest.mark.parametrize(
    ("fields", "cls", "expected"),
    [
        ({"type": "response.created", "response_id": "r1", "turn_id": 0}, ResponseCreated,
         {"response_id": "r1", "turn_id": 0}),
        ({"type": "response.created", "response_id": "r1"}, ResponseCreated, {"turn_id": None}),
        ({"type": "response.speak", "response_id": "r1"}, ResponseSpeak, {"response_id": "r1"}),
        ({"type": "response.listen"}, ResponseListen, {"response_id": None, "turn_id": None}),
        ({"type": "response.text.delta", "response_id": "r1", "turn_id": 2, "text": "Hi",
          "ttft_ms": 88}, TextDelta, {"response_id": "r1", "turn_id": 2, "text": "Hi",
                                      "ttft_ms": 88.0}),
        ({"type": "response.text.delta", "response_id": "r1", "text": ""}, TextDelta,
         {"turn_id": None, "ttft_ms": None}),
        ({"type": "response.done", "response_id": "r1", "status": "cancelled"}, ResponseDone,
         {"response_id": "r1", "status": "cancelled"}),
        ({"type": "response.done", "status": "completed"}, ResponseDone, {"response_id": None}),
        ({"type": "error", "code": "INVALID_ARG", "message": "bad rate"}, ErrorEvent,
         {"code": "INVALID_ARG", "message": "bad rate"}),
        ({"type": "error", "code": 3, "message": "m"}, ErrorEvent, {"code": "3"}),
        ({"type": "session.closed", "reason": "idle"}, SessionClosed, {"reason": "idle"}),
        ({"type": "session.closed"}, SessionClosed, {"reason": None}),
    ],
)
def test_typed_fields(fields, cls, expected):
    event = parse_event(payload(**fields))
    assert isinstance(event, cls)
    assert {key: getattr(event, key) for key in expected} == expected


def test_int_session_id_is_kept():
    event = parse_event(json.dumps({"type": "session.created", "session_id": 42}))
    assert event.session_id == 42


def test_unknown_type_is_kept_generic():
    event = parse_event(payload(type="session.heartbeat", seq=7))
    assert isinstance(event, UnknownEvent)
    assert event.type == "session.heartbeat" and event.raw["seq"] == 7


@pytest.mark.parametrize(
    ("text", "audio", "message"),
    [
        ("not json", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        (json.dumps({"session_id": "s1"}), None, "'type'"),
        (json.dumps({"type": "session.created"}), None, "'session_id'"),
        (payload(type="response.created"), None, "'response_id'"),
        (payload(type="response.created", response_id=7), None, "'response_id'"),
        (payload(type="response.done", status="ok"), None, "status must be one of"),
        (payload(type="error", code="X"), None, "'message'"),
        (payload(type="response.text.delta", response_id="r"), None, "'text'"),
        (payload(type="response.audio.delta", response_id="r", turn_id=0, text=""), AUDIO,
         "'audio_ms'"),
        (payload(type="response.audio.delta", response_id="r", turn_id=True, text="", audio_ms=1),
         AUDIO, "'turn_id'"),
        (payload(type="response.audio.delta", response_id="r", turn_id=0, text="", audio_ms=1),
         None, "without an AUDIO_OUT"),
        (payload(type="response.audio.delta", response_id="r", turn_id=0, text="", audio_ms=1),
         AUDIO.astype(np.float32), "int16"),
        (payload(type="response.listen"), AUDIO, "only allowed on response.audio.delta"),
    ],
)
def test_contract_violations_raise(text, audio, message):
    with pytest.raises(EventParseError, match=message):
        parse_event(text, audio=audio)


def test_is_error():
    assert is_error(parse_event(payload(type="error", code="X", message="m")))
    assert is_error(RequestFailed("client.request_failed", "s1", 0.0, "refused"))
    assert is_error(parse_event(payload(type="response.done", status="failed")))
    assert not is_error(parse_event(payload(type="response.done", status="cancelled")))
    assert not is_error(parse_event(payload(type="session.closed")))
