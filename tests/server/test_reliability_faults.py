"""Faults contained to one session, on a real server: an exception inside one request of the
thinker, talker or code2wav ends that session with an `error` event while a concurrent session
on the same stage completes; a full Thinker context reaches the client as
`context_length_exceeded`; either way the stage frees the request (exactly once) and serves on.

Strategy: the reliability server runs with fault_injection=on, so a session whose id contains
`fault-<stage>` fails inside that stage (backends/serving/fault_injection.py); its context is
320 tokens, so ~20 forced-listen units fill it. Freed state is read from the resource gauges:
a double free would leave the KV pool above its size, a leak below it.
"""
from __future__ import annotations

import threading
import uuid

import pytest
from server_resources import settled
from session_probe import SessionProbe, silence_units

from backends.serving.fault_injection import fault_marker

REPLY = {"initial_user_text": "Say something.", "reply_units": 2, "reply_tokens_per_unit": 2}
OVERFLOW_UNITS = 40  # far past 320 tokens at ~14 tokens per forced-listen unit
OVERFLOW_STEP = 4  # units per append, sent once the Thinker took the previous ones (the uplink bound is 5 s)


def _converse(probe: SessionProbe, seed: int) -> None:
    probe.start(seed=seed, **REPLY)
    probe.append(silence_units(3))


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
def test_a_fault_inside_a_stage_ends_only_its_session(reliability_server, baseline, probes, stage):
    bad = probes(f"rel-{fault_marker(stage)}-{uuid.uuid4().hex[:6]}")
    good = probes()
    starts = [threading.Thread(target=_converse, args=(probe, 5)) for probe in (bad, good)]
    for thread in starts:  # both sessions reach the stage together
        thread.start()
    for thread in starts:
        thread.join(30)
    error = bad.wait_type("error")
    assert error["code"] == "internal" and "injected fault" in error["message"], error
    assert bad.wait_type("session.closed")["reason"] == "error"
    bad.close()
    done = good.wait_type("response.done")
    assert done["status"] == "completed" and good.audio_of(done["response_id"])
    good.close()
    assert "error" not in good.types()
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


def test_the_stages_serve_on_after_faults(probes):
    probe = probes()
    _converse(probe, seed=6)
    assert probe.wait_type("response.done")["status"] == "completed"
    probe.close()


def test_edge_case_9_context_overflow_reaches_the_client_and_frees_the_request_once(reliability_server, baseline, probes):
    probe = probes()
    probe.start(force_listen_count=OVERFLOW_UNITS)  # every unit a one-token listen: steady growth
    for sent in range(OVERFLOW_STEP, OVERFLOW_UNITS + 1, OVERFLOW_STEP):
        probe.append(silence_units(OVERFLOW_STEP))
        event = probe.wait_for(lambda e: e["type"] == "error" or probe.types().count("response.listen") >= sent,
                               f"{sent} units decided")
        if event["type"] == "error":
            break
    error = probe.wait_type("error")
    assert error["code"] == "context_length_exceeded", error
    assert "context" in error["message"] and probe.session_id in error["message"]
    closed = probe.wait_type("session.closed")
    assert closed["reason"] == "error"
    listens = probe.types().count("response.listen")
    assert 5 < listens < OVERFLOW_UNITS, f"{listens} units before the overflow"
    probe.close()
    after = settled(reliability_server, baseline)
    assert after.tracked() == baseline.tracked()
    kv_free, kv_total = after.gauges[("kv_free_blocks", "thinker")], after.gauges[("kv_blocks", "thinker")]
    assert kv_free == kv_total, "the KV pool is not whole again (a leak or a double free)"
