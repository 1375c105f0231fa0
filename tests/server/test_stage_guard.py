"""The public port on a real server: stage models refuse whoever lacks the server's stage secret,
and a START parameter the stages could not hold is refused at START.

Without the secret, six Thinker setups (more than the server's session slots) are refused and
the stages' resource gauges stay at their idle baseline, so a new session is still created; a
`stop` for another client's stage request id is refused and that session's reply goes on to
the end; `health` is answered without the secret. A seed past the limit (where seed + 42 once
overflowed the Talker's int64 seed and failed the session with `internal`) is refused at START
with `invalid_argument`, while another session goes on. On the reliability server.
"""
from __future__ import annotations

import numpy as np
import pytest
from server_resources import settled
from session_probe import silence_units
from stage_calls import StageEndpoint, call

from backends.contracts.messages import ThinkerRequest, stop_request
from backends.contracts.stage_clients import STAGES
from backends.duplex.uplink import MAX_SEED
from backends.serving.stage_health import health_request

REPLY = {"initial_user_text": "Hello.", "reply_units": 1, "reply_tokens_per_unit": 2}
FORBIDDEN = "[forbidden]"
SETUP_ATTEMPTS = 6  # past the reliability server's 4 sessions (and the Thinker's slot margin)


def _outsiders(server) -> list[StageEndpoint]:
    """Clients of the public port: no secret, and a wrong one of the right length."""
    return [StageEndpoint(server.grpc_url, None), StageEndpoint(server.grpc_url, "0" * len(server.stage_secret))]


def _setup(request_id: str) -> ThinkerRequest:
    """The first request of a session: it would hold a Thinker slot and KV until stopped."""
    return ThinkerRequest(request_id=request_id, audio=np.zeros(0, np.float32), seq=0)


def _errors(events: list[dict]) -> list[dict]:
    return [event for event in events if event["type"] == "error"]


def test_stage_requests_without_the_secret_hold_nothing(reliability_server, baseline, probes):
    for outsider in _outsiders(reliability_server):
        for index in range(SETUP_ATTEMPTS):
            answer = call(outsider, "thinker", _setup(f"guard-{index}.e0"))
            assert answer.error and FORBIDDEN in answer.error and answer.results == [], answer
        for stage in STAGES:
            assert FORBIDDEN in (call(outsider, stage, stop_request(stage, "guard-0.e0")).error or "")
            assert call(outsider, stage, health_request(stage)).error is None  # health holds nothing
    after = settled(reliability_server, baseline)
    assert after.tracked() == baseline.tracked()
    session = probes()
    session.start(**REPLY)
    assert session.wait_type("session.created")


def test_a_stop_without_the_secret_leaves_another_session_alone(reliability_server, probes):
    victim = probes()
    victim.start(**REPLY)
    victim.wait_type("session.created")
    request_id = f"{victim.session_id}.e0"  # the victim's stage requests, from its session id
    for outsider in _outsiders(reliability_server):
        for stage in STAGES:
            assert FORBIDDEN in (call(outsider, stage, stop_request(stage, request_id)).error or "")
    victim.append(silence_units(2))
    victim.wait_type("response.done")
    assert _errors(victim.events) == [] and victim.failures == []
    assert any(event["type"] == "response.audio.delta" for event in victim.events)


@pytest.mark.parametrize("seed", [2**63 - 42, 2**63 - 1, MAX_SEED + 1])
def test_a_seed_past_the_limit_is_refused_at_start_while_another_session_goes_on(probes, seed):
    other = probes()
    other.start(**REPLY)
    other.wait_type("session.created")
    refused = probes()
    refused.start(seed=seed, **REPLY)
    events = refused.wait_closed()
    assert [event["type"] for event in events] == ["error"], events
    assert events[0]["code"] == "invalid_argument"
    assert "parameter seed" in events[0]["message"] and f"[0, {MAX_SEED}]" in events[0]["message"]
    other.append(silence_units(2))
    other.wait_type("response.done")
    assert _errors(other.events) == [] and other.failures == []
