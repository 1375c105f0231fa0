"""Tests for client/demux.py.

Strategy: feed real tritonclient `InferResult` protobufs (built by the `make_result` fixture
exactly as the stream callback receives them) and in-band / gRPC errors in chosen orders,
then check the routed events, the FINAL bookkeeping (`is_settled`) and that every contract
violation raises DuplexProtocolError instead of being dropped.
"""

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException

from client.demux import DOWNLINK_REQUEST_ID, Arrival, DownlinkDemux
from client.errors import DuplexProtocolError, DuplexStreamError
from client.events import AudioDelta, RequestFailed, SessionClosed, SessionCreated

DOWN = DOWNLINK_REQUEST_ID


def arrive(result=None, error=None, at: float = 0.0) -> Arrival:
    return Arrival(at, result, error)


def event(kind: str, **fields: object) -> dict:
    return {"type": kind, "session_id": "s1", **fields}


@pytest.fixture
def demux() -> DownlinkDemux:
    demux = DownlinkDemux("s1")
    demux.open_downlink()
    return demux


def test_routes_events_and_counts_finals(demux, make_result):
    demux.expect_uplink("uplink-1")
    created = demux.process(arrive(make_result(DOWN, event=event("session.created")), at=1.5))
    assert isinstance(created, SessionCreated) and created.received_s == 1.5
    assert demux.process(arrive(make_result("uplink-1", final=True))) is None
    assert demux.num_pending_uplink == 0 and not demux.is_settled  # downlink still open
    audio = np.arange(10, dtype=np.int16)
    delta = demux.process(arrive(make_result(DOWN, audio=audio, event=event(
        "response.audio.delta", response_id="r", turn_id=0, text="", audio_ms=1))))
    assert isinstance(delta, AudioDelta)
    np.testing.assert_array_equal(delta.audio, audio)
    assert demux.process(arrive(make_result(DOWN, final=True))) is None
    assert demux.is_settled


def test_final_may_ride_on_the_last_event(demux, make_result):
    closed = demux.process(arrive(make_result(DOWN, event=event("session.closed"), final=True)))
    assert isinstance(closed, SessionClosed)
    assert not demux.downlink_open and demux.is_settled


def test_settled_waits_for_every_uplink_final(demux, make_result):
    demux.expect_uplink("uplink-1")
    demux.expect_uplink("uplink-2")
    demux.process(arrive(make_result(DOWN, final=True)))
    demux.process(arrive(make_result("uplink-2", final=True)))
    assert not demux.is_settled and demux.num_pending_uplink == 1
    demux.process(arrive(make_result("uplink-1", final=True)))
    assert demux.is_settled


def test_in_band_error_with_no_unanswered_uplink_was_start(demux):
    failed = demux.process(arrive(error=InferenceServerException("too many sessions"), at=2.0))
    assert isinstance(failed, RequestFailed)
    assert (failed.message, failed.received_s) == ("too many sessions", 2.0)
    assert failed.session_id == "s1"
    assert not demux.downlink_open and demux.is_settled


def test_in_band_error_counts_as_an_uplink_final(demux, make_result):
    demux.expect_uplink("uplink-1")
    demux.process(arrive(error=InferenceServerException("bad sample rate")))
    assert demux.downlink_open and demux.num_pending_uplink == 0
    demux.process(arrive(make_result(DOWN, final=True)))
    assert demux.is_settled


def test_start_failure_seen_while_an_uplink_was_unanswered_is_reconciled(demux, make_result):
    """Without reconciliation the downlink would wait forever for a FINAL that never comes."""
    demux.expect_uplink("uplink-1")
    demux.process(arrive(error=InferenceServerException("refused")))  # START's, unknowable yet
    assert demux.downlink_open
    demux.process(arrive(make_result("uplink-1", final=True)))  # so the error was not uplink-1's
    assert not demux.downlink_open and demux.is_settled


@pytest.mark.parametrize("status,code", [("StatusCode.UNAVAILABLE", "server_restarting"),
                                         ("StatusCode.INTERNAL", "stream_failed")])
def test_grpc_failure_raises_and_ends_everything(demux, status, code):
    demux.expect_uplink("uplink-1")
    error = InferenceServerException("reset", status=status)
    with pytest.raises(DuplexStreamError, match=code if code == "server_restarting" else "INTERNAL") as raised:
        demux.process(arrive(error=error))
    assert raised.value.code == code
    assert demux.is_settled


def two_element_event() -> InferResult:
    response = service_pb2.ModelInferResponse(id=DOWN)
    response.outputs.add(name="EVENT", datatype="BYTES", shape=[2])
    response.raw_output_contents.append(b"\x02\x00\x00\x00{}\x02\x00\x00\x00{}")
    return InferResult(response)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda make: make("uplink-9", final=True), "unknown request id 'uplink-9'"),
        (lambda make: make("uplink-1", event=event("session.created"), final=True),
         "must get one empty FINAL"),
        (lambda make: make("uplink-1"), "must get one empty FINAL"),
        (lambda make: make(DOWN), "non-final downlink response without EVENT"),
        (lambda make: make(DOWN, event={"type": "session.created"}), "session_id"),
        (lambda make: two_element_event(), "one element"),
    ],
)
def test_contract_violations_raise(demux, make_result, build, message):
    demux.expect_uplink("uplink-1")
    with pytest.raises(DuplexProtocolError, match=message):
        demux.process(arrive(build(make_result)))


def test_downlink_response_after_final_raises(demux, make_result):
    demux.process(arrive(make_result(DOWN, final=True)))
    with pytest.raises(DuplexProtocolError, match="after its FINAL"):
        demux.process(arrive(make_result(DOWN, event=event("session.closed"))))


def test_request_ids_must_be_unique(demux):
    demux.expect_uplink("uplink-1")
    for request_id in ("uplink-1", DOWN):
        with pytest.raises(ValueError, match="already in use"):
            demux.expect_uplink(request_id)


def test_a_moved_downlink_goes_on_on_the_move_request(demux, make_result):
    demux.expect_move("uplink-1")
    assert demux.moving
    with pytest.raises(ValueError, match="under way"):
        demux.expect_move("uplink-2")
    assert demux.process(arrive(make_result(DOWN, event=event("downlink.moved"), final=True))) is None
    assert demux.downlink_open and not demux.moving and demux.num_pending_uplink == 0
    closed = demux.process(arrive(make_result("uplink-1", event=event("session.closed"), final=True)))
    assert isinstance(closed, SessionClosed) and demux.is_settled
    with pytest.raises(DuplexProtocolError, match="after its FINAL"):
        demux.process(arrive(make_result(DOWN, event=event("session.created"))))


def test_an_event_on_the_move_request_before_the_notice_is_followed(demux, make_result):
    demux.expect_move("uplink-1")
    created = demux.process(arrive(make_result("uplink-1", event=event("session.created"))))
    assert isinstance(created, SessionCreated) and not demux.moving
    assert demux.process(arrive(make_result(DOWN, event=event("downlink.moved"), final=True))) is None
    assert demux.process(arrive(make_result("uplink-1", final=True))) is None
    assert demux.is_settled


def test_a_refused_move_counts_as_a_failed_uplink(demux, make_result):
    demux.expect_move("uplink-1")
    failed = demux.process(arrive(error=InferenceServerException("[session_not_found] closing")))
    assert isinstance(failed, RequestFailed) and demux.downlink_open
    demux.process(arrive(make_result(DOWN, event=event("session.closed"), final=True)))
    assert demux.is_settled


def test_a_move_notice_without_a_move_is_a_protocol_error(demux, make_result):
    with pytest.raises(DuplexProtocolError, match="downlink.moved"):
        demux.process(arrive(make_result(DOWN, event=event("downlink.moved"), final=True)))
