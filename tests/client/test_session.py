"""Tests for client/session.py.

Strategy: drive a `DuplexSession` against `FakeTritonClient` (tests/client/conftest.py), which
encodes requests with tritonclient's own builder, delivers real `InferResult`s from its own
thread and raises on any use the real client or server would reject. Tests check what went
on the wire, the events and audio that come back, that FINALs are consumed rather than
surfaced, that every wait ends (timeouts are short on purpose), and teardown.
"""

import threading

import numpy as np
import pytest
from tritonclient.grpc import InferInput

from client.errors import DuplexProtocolError, DuplexStateError, DuplexStreamError, DuplexTimeout
from client.events import AudioDelta, ErrorEvent, RequestFailed, ResponseDone, SessionClosed, SessionCreated
from client.params import SessionParams
from client.session import DuplexSession

WAIT_S = 30.0  # generous bound for events the fake has already queued
SHORT_WAIT_S = 0.05  # for waits that must time out


def events_until_closed(session: DuplexSession) -> list:
    return list(session.drain(WAIT_S))


def delta(response_id: str, audio_ms: int, **extra: object) -> dict:
    return {"type": "response.audio.delta", "response_id": response_id, "turn_id": 0,
            "text": "", "audio_ms": audio_ms, **extra}


@pytest.fixture
def fake(fake_client_factory):
    return fake_client_factory()


@pytest.fixture
def session(fake):
    session = DuplexSession(fake, "sess-1")
    yield session
    session.close()


def test_start_sends_one_start_request_with_typed_parameters(session, fake):
    ref = np.arange(160, dtype=np.int16)
    session.start(SessionParams(instructions="hi", temperature=0.5, reply_units=2), ref_audio=ref)
    (start,) = fake.requests
    assert start.id == "downlink" and start.parameters["sequence_start"].bool_param
    assert start.parameters["sequence_id"].string_param == "sess-1"
    assert start.parameters["temperature"].double_param == 0.5
    assert start.parameters["reply_units"].int64_param == 2
    assert fake.audio_of(start).shape == (0,)
    assert [tensor.name for tensor in start.inputs] == ["AUDIO", "REF_AUDIO"]
    assert isinstance(session.next_event(WAIT_S), SessionCreated)


def test_uplink_requests_have_distinct_ids_and_actions(session, fake):
    session.start()
    pcm = np.array([1, -2, 3], dtype=np.int16)
    session.append(pcm)
    session.commit()
    session.cancel()
    session.end()
    uplink = fake.uplink_requests()
    assert [r.id for r in uplink] == ["uplink-1", "uplink-2", "uplink-3", "uplink-4"]
    assert [fake.action_of(r) for r in uplink] == ["append", "commit", "cancel", None]
    assert uplink[0].parameters["sample_rate"].int64_param == 16000
    np.testing.assert_array_equal(fake.audio_of(uplink[0]), pcm)
    assert uplink[-1].parameters["sequence_end"].bool_param


def test_int_session_id_travels_as_int(fake):
    session = DuplexSession(fake, 77)
    session.start()
    assert fake.requests[0].parameters["sequence_id"].int64_param == 77
    session.close()


def test_events_come_in_order_and_finals_are_not_events(session, fake):
    session.start()
    for _ in range(3):
        session.append(np.zeros(3200, dtype=np.int16))
    session.end()
    kinds = [type(event) for event in events_until_closed(session)]
    assert kinds == [SessionCreated, SessionClosed]
    assert session.is_settled and not session.downlink_open
    assert session.next_event(WAIT_S) is None


def test_audio_is_collected_per_response_in_arrival_order(session, fake):
    def script(fake, request):
        if fake.action_of(request) == "commit":
            fake.emit(delta("a", 1), np.full(24, 1, dtype=np.int16))
            fake.emit(delta("b", 1), np.full(24, 2, dtype=np.int16))
            fake.emit(delta("a", 2), np.full(24, 3, dtype=np.int16))
            fake.emit({"type": "response.done", "response_id": "a", "status": "completed"})

    fake.on_request = script
    session.start()
    session.commit()
    session.end()
    events = events_until_closed(session)
    assert sum(isinstance(event, AudioDelta) for event in events) == 3
    assert isinstance(events[4], ResponseDone)
    np.testing.assert_array_equal(session.response_audio("a"), [1] * 24 + [3] * 24)
    np.testing.assert_array_equal(session.response_audio("b"), [2] * 24)
    np.testing.assert_array_equal(session.reply_audio(), [1] * 24 + [2] * 24 + [3] * 24)
    assert session.response_audio("zzz").shape == (0,)


class ThreadRecordingSession(DuplexSession):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.callback_threads: list[threading.Thread] = []

    def _on_response(self, **kwargs):
        self.callback_threads.append(threading.current_thread())
        super()._on_response(**kwargs)


def test_callback_runs_on_the_stream_thread_and_only_enqueues(fake):
    """A parse error must surface in the caller's thread, not die on the stream thread."""
    session = ThreadRecordingSession(fake, "s")
    session.start()
    fake.emit({"type": "response.created"})  # missing response_id: a contract violation
    assert isinstance(session.next_event(WAIT_S), SessionCreated)
    with pytest.raises(DuplexProtocolError, match="response_id"):
        session.next_event(WAIT_S)
    assert len(session.callback_threads) == 2
    assert threading.current_thread() not in session.callback_threads
    session.close()


def test_next_event_times_out(session, fake):
    fake.send_created = False
    session.start()
    with pytest.raises(DuplexTimeout, match="no downlink event"):
        session.next_event(SHORT_WAIT_S)


def test_drain_times_out_when_the_downlink_never_closes(fake_client_factory):
    fake = fake_client_factory(close_on_end=False)
    session = DuplexSession(fake, "s")
    session.start()
    session.end()
    with pytest.raises(DuplexTimeout, match="downlink open: True"):
        list(session.drain(SHORT_WAIT_S))
    session.close()
    assert fake.stop_calls[0] is True  # unsettled: the stream is cancelled, not joined


def test_events_until_returns_at_the_deadline(session, fake):
    session.start()
    fake.flush()  # session.created has arrived, however late the fake's thread ran
    events = session.events_until(session.started_s + SHORT_WAIT_S)
    assert [type(event) for event in events] == [SessionCreated]


def sent_end(fake) -> bool:
    return any(request.parameters["sequence_end"].bool_param for request in fake.requests)


def test_refused_start_sends_no_end_and_settles(fake_client_factory):
    fake = fake_client_factory(refuse_start="admission limit reached")
    session = DuplexSession(fake, "s")
    session.start()
    refusal = session.next_event(WAIT_S)
    assert isinstance(refusal, ErrorEvent) and "admission" in refusal.message
    assert session.start_refused  # the error came before session.created
    assert session.next_event(WAIT_S) is None  # then the downlink's FINAL
    assert session.end() is None and not sent_end(fake)  # the server ended the sequence itself
    assert session.is_settled and events_until_closed(session) == []
    session.close()
    assert fake.stop_calls[0] is False


def test_start_failed_by_triton_sends_no_end(fake_client_factory):
    fake = fake_client_factory(fail_start="inference request for sequence s is invalid")
    session = DuplexSession(fake, "s")
    session.start()
    failed = session.next_event(WAIT_S)
    assert isinstance(failed, RequestFailed) and "invalid" in failed.message
    assert session.next_event(WAIT_S) is None  # START's error closed the downlink
    assert session.start_refused
    assert session.end() is None and not sent_end(fake)
    with pytest.raises(DuplexStateError, match="cannot append in phase 'ended'"):
        session.append(np.zeros(4, dtype=np.int16))
    session.close()
    assert fake.stop_calls[0] is False


def test_error_after_session_created_keeps_the_end(session, fake):
    session.start()
    assert isinstance(session.next_event(WAIT_S), SessionCreated)
    fake.emit({"type": "error", "code": "invalid_argument", "message": "odd audio"})
    assert isinstance(session.next_event(WAIT_S), ErrorEvent)
    assert not session.start_refused
    assert session.end() is not None and sent_end(fake)
    assert isinstance(events_until_closed(session)[-1], SessionClosed)


def test_broken_stream_raises_stream_error(session, fake):
    session.start()
    assert isinstance(session.next_event(WAIT_S), SessionCreated)
    fake.break_stream()
    with pytest.raises(DuplexStreamError, match="connection reset"):
        session.next_event(WAIT_S)
    with pytest.raises(DuplexStreamError, match="no longer in valid state"):
        session.append(np.zeros(4, dtype=np.int16))


def test_a_send_refused_by_a_broken_stream_raises_why_it_broke(session, fake):
    """The real client refuses sends once the stream broke, while its error (the server went
    away) is still on its way through the callback: that error is the one raised."""
    session.start()
    assert isinstance(session.next_event(WAIT_S), SessionCreated)
    fake.break_stream()
    with pytest.raises(DuplexStreamError, match="connection reset") as broken:
        session.append(np.zeros(4, dtype=np.int16))
    assert broken.value.code == "server_restarting"


def test_methods_out_of_order_raise(session):
    with pytest.raises(DuplexStateError, match="cannot append in phase 'new'"):
        session.append(np.zeros(4, dtype=np.int16))
    session.start()
    with pytest.raises(DuplexStateError, match="cannot start"):
        session.start()
    session.end()
    with pytest.raises(DuplexStateError, match="cannot commit in phase 'ended'"):
        session.commit()


@pytest.mark.parametrize(
    "pcm", [np.zeros(4, dtype=np.float32), np.zeros((2, 2), dtype=np.int16), [1, 2, 3]]
)
def test_append_rejects_non_pcm16(session, pcm):
    session.start()
    with pytest.raises(ValueError, match="1-D int16"):
        session.append(pcm)


def test_close_is_graceful_when_settled_and_idempotent(session, fake):
    session.start()
    session.end()
    events_until_closed(session)
    session.close()
    session.close()
    assert fake.stop_calls[0] is False
    with pytest.raises(fake.Violation, match="after close"):
        fake.is_model_ready("duplex")


def test_check_ready(fake_client_factory):
    DuplexSession(fake_client_factory(), "s").check_ready(WAIT_S)
    with pytest.raises(DuplexStreamError, match="not ready"):
        DuplexSession(fake_client_factory(ready=False), "s").check_ready(WAIT_S)


@pytest.mark.parametrize("session_id", [0, "", True])
def test_session_id_must_name_a_sequence(fake, session_id):
    with pytest.raises(ValueError, match="session_id"):
        DuplexSession(fake, session_id)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sequence_id": "s", "sequence_start": True}, "empty FINAL"),
        ({"enable_empty_final_response": True}, "outside a sequence"),
        ({"sequence_id": "s", "sequence_start": True, "enable_empty_final_response": True,
          "inputs": []}, "inputs"),
        ({"sequence_id": "s", "sequence_start": True, "enable_empty_final_response": True,
          "parameters": {"action": "stop"}}, "bad action"),
        ({"sequence_id": "s", "sequence_start": True, "enable_empty_final_response": True,
          "parameters": {"temperature": "0.5"}}, "START-only double_param"),
    ],
)
def test_fake_rejects_misuse(fake, kwargs, message):
    """The fake must be able to fail, or the session tests above prove nothing."""
    audio = InferInput("AUDIO", [2], "INT16")
    audio.set_data_from_numpy(np.zeros(2, dtype=np.int16))
    fake.start_stream(lambda result, error: None)
    call = {"inputs": [audio], "request_id": "x", **kwargs}
    with pytest.raises(fake.Violation, match=message):
        fake.async_stream_infer("duplex", **call)
