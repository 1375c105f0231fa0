"""Session settings no START request can carry faithfully are refused at the codec with
`invalid_event` (found by perf/fuzz_gateway.py): a prompt or a `duplex_params` string with NUL
characters (Triton would cut it at the first one) and values past what a request parameter holds (lists, objects, integers
past int64, which used to end the connection without an error)."""
from __future__ import annotations

import json

import pytest

from backends.gateway.commands import Init
from backends.gateway.demo_codec import DemoCodec
from backends.gateway.errors import GatewayError
from backends.gateway.realtime_codec import RealtimeCodec
from backends.gateway.session_context import SessionContext

HUGE = 2**70


def _realtime(payload: dict) -> Init:
    return RealtimeCodec(SessionContext("s")).parse(json.dumps({"type": "session.init", "payload": payload}))


def _demo(message: dict) -> Init:
    return DemoCodec(SessionContext("s"), "c").parse(json.dumps({"type": "prepare", **message}))


@pytest.mark.parametrize("parse", [
    lambda: _realtime({"system_prompt": "be\x00brief"}),
    lambda: _demo({"prefix_system_prompt": "\x00"}),
    lambda: _realtime({"config": {"temperature": HUGE}}),
    lambda: _demo({"config": {"top_k": -HUGE}}),
    lambda: _realtime({"duplex_params": {"seed": HUGE}}),
    lambda: _realtime({"duplex_params": {"reply_units": [1]}}),
    lambda: _realtime({"duplex_params": {"instructions": {"a": 1}}}),
    lambda: _realtime({"duplex_params": {"initial_user_text": "hi\x00there"}}),
])
def test_unrepresentable_settings_are_invalid_events(parse):
    with pytest.raises(GatewayError) as err:
        parse()
    assert err.value.code == "invalid_event" and err.value.message


def test_representable_settings_pass_as_they_are():
    init = _realtime({"system_prompt": "be brief", "config": {"temperature": 0.5},
                      "duplex_params": {"seed": 2**63 - 1, "listen_when_silent": True, "sliding_window_mode": "off"}})
    assert init.params == {"temperature": 0.5, "instructions": "be brief", "seed": 2**63 - 1,
                           "listen_when_silent": True, "sliding_window_mode": "off"}
    assert _demo({"config": {"top_k": -2**63}}).params == {"top_k": -2**63}
