"""A Realtime error ends its session and the gateway closes the socket: the error, usage and
session.closed must reach a client that still has frames in flight (they used to be lost now
and then, in a TCP reset, when the gateway closed while its reader waited on the socket)."""
from __future__ import annotations

import json

import pytest

from gateway_settings import API_KEY
from perf.fuzz_gateway_inputs import REALTIME, Frame, GatewayCase, Handshake, append, close
from perf.fuzz_gateway_wire import run_case

pytestmark = pytest.mark.server

SILENCE = append(REALTIME, "A" * 2136, 0.02)  # 534 float32 samples: about 33 ms
ATTEMPTS = 30


def test_the_error_that_ends_a_session_is_never_lost(gateway):
    bad = Frame("bad", json.dumps({"type": "session.init", "payload": True}), code="invalid_event")
    case = GatewayCase("error_then_close", REALTIME, Handshake(), (bad, *[SILENCE] * 12, close(REALTIME)))
    answers = [run_case(gateway.ws_url, case, API_KEY) for _ in range(ATTEMPTS)]
    kinds = [[event["type"] for event in answer.events] for answer in answers]
    assert all(kind == ["session.queue_done", "error", "usage", "session.closed"] for kind in kinds), kinds
    assert all(answer.codes() == ["invalid_event"] for answer in answers)
