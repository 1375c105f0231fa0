"""The orchestrator's own END for a dead session (TritonDownlink.abandon) and its recognition
(is_sequence_release): the END names the session's sequence and carries the release mark that
`execute` answers without touching any session. A downlink's move to another request.

Strategy: a fake pb_utils records the BLS request `abandon` sends; the request `duplex` would
receive is rebuilt from it (its parameters as the JSON Triton hands a model). The real slot
release runs in the server tests (tests/server: a dropped client's slot is free again).
"""
from __future__ import annotations

import json
import threading

from backends.duplex.events import ServerEvent
from backends.serving.triton_duplex import RELEASE_PARAMETER, TritonDownlink, is_sequence_release
from backends.serving.triton_responses import ResponseThread


def _downlink(pb, sequence):
    responses = ResponseThread(pb, "test-responses")
    return TritonDownlink(pb, pb.Sender(), responses, sequence), responses


def test_abandon_ends_the_sessions_own_sequence(pb):
    downlink, responses = _downlink(pb, ("duplex", "client-7"))
    downlink.close()
    downlink.abandon()
    responses.shutdown()
    [request] = pb.bls_requests
    assert (request.model_name, request.correlation_id) == ("duplex", "client-7")
    assert request.flags == pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END and request.inputs == {}
    received = pb.Request({}, parameters_json=json.dumps(request.parameters))
    assert is_sequence_release(received)


def test_a_downlink_without_a_sequence_releases_nothing(pb):
    downlink, responses = _downlink(pb, None)
    downlink.abandon()
    responses.shutdown()
    assert pb.bls_requests == []


def test_only_the_release_mark_makes_a_release():
    for parameters in ("{}", "", "not json", "[1]", json.dumps({RELEASE_PARAMETER: "true"}),
                       json.dumps({"other": True})):
        assert not is_sequence_release(_Request(parameters)), parameters
    assert is_sequence_release(_Request(json.dumps({RELEASE_PARAMETER: True, "other": 1})))


class _Request:
    def __init__(self, parameters: str) -> None:
        self._parameters = parameters

    def parameters(self) -> str:
        return self._parameters


def _event_types(sender) -> list[str]:
    types = []
    for response, _ in sender.sent:
        if response is not None:
            [tensor] = [t for t in response.output_tensors() if t.name() == "EVENT"]
            types.append(json.loads(tensor.as_numpy()[0])["type"])
    return types


def test_a_move_ends_the_old_request_with_the_notice_and_sends_on_the_new(pb):
    """Events sent from two threads while the downlink moves three times: each request gets its
    events, then the notice in its FINAL, and nothing after it; no event is lost or doubled."""
    responses = ResponseThread(pb, "test-responses")
    senders = [pb.Sender() for _ in range(4)]
    downlink = TritonDownlink(pb, senders[0], responses)
    notice = ServerEvent("downlink.moved", "s", {})

    def talk(base: int) -> None:
        for i in range(300):
            downlink.send(ServerEvent(f"e{base + i}", "s", {}))

    threads = [threading.Thread(target=talk, args=(base,)) for base in (0, 1000)]
    for thread in threads:
        thread.start()
    for sender in senders[1:]:
        assert downlink.move(TritonDownlink(pb, sender, responses), notice)
    for thread in threads:
        thread.join()
    downlink.close()
    assert not downlink.move(TritonDownlink(pb, pb.Sender(), responses), notice)
    responses.shutdown()
    for sender in senders:
        finals = [i for i, (_, flags) in enumerate(sender.sent) if flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
        assert finals == [len(sender.sent) - 1], "one FINAL, and nothing after it"
    for sender in senders[:-1]:
        assert _event_types(sender)[-1] == "downlink.moved"
    events = [t for sender in senders for t in _event_types(sender) if t != "downlink.moved"]
    assert sorted(events) == sorted(f"e{base + i}" for base in (0, 1000) for i in range(300))
