"""The orchestrator's own END for a dead session (TritonDownlink.abandon) and its recognition
(is_sequence_release): the END names the session's sequence and carries the release mark that
`execute` answers without touching any session.

Strategy: a fake pb_utils records the BLS request `abandon` sends; the request `duplex` would
receive is rebuilt from it (its parameters as the JSON Triton hands a model). The real slot
release runs in the server tests (tests/server: a dropped client's slot is free again).
"""
from __future__ import annotations

import json

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
