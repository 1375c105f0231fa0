"""Session lifecycle on a real server: barge-in, a client that goes away, idle reaping, admission.

Strategy: raw sessions (tests/server/session_probe.py) on the reliability server (conftest:
10 s idle timeout, fault injection on). What the stages hold is read from the resource gauges
on the metrics port (tests/server/server_resources.py), so "stopped and freed" is checked on
the stage engines themselves, not inferred from the events. Replies are forced with the
policy knobs (random weights); audio is sent faster than real time.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import RELIABILITY_OVERRIDES
from server_resources import ServerResources, wait_for_gauges
from session_probe import SessionProbe, silence_units, speech_units

from backends.duplex.session_manager import CLOSING_GRACE

REPLY = {"initial_user_text": "Tell me a story.", "reply_units": 4, "reply_tokens_per_unit": 2, "seed": 3}
# TTFP of admitted sessions under a START storm vs. without it. Both runs share a loaded 2-core
# box (timings vary by ~2x between runs there), so the bound only catches a storm that stalls
# the admitted sessions (refusals queued behind stage work would add seconds).
TTFP_STORM_FACTOR = 2.5
TTFP_STORM_SLACK_MS = 500.0
IDLE_TIMEOUT_S = float(RELIABILITY_OVERRIDES["idle_timeout_s"])
STAGE_IDLE = {("requests", "thinker"): 0.0, ("requests", "talker"): 0.0, ("codec_states", "code2wav"): 0.0}
WHOLE_KV = (("kv_free_blocks", "thinker"), ("kv_free_blocks", "talker"))
SESSION_KV_BLOCKS = 320 // 16  # the reliability server's max_context_tokens / KV block size


def _first_audio(probe: SessionProbe) -> dict:
    return probe.wait_type("response.audio.delta")


def test_barge_in_cancels_the_response_and_frees_its_stage_state(reliability_server, baseline, probes):
    probe = probes()
    probe.start(**REPLY)
    probe.append(silence_units(4))
    audio = _first_audio(probe)
    old = audio["response_id"]
    probe.cancel()
    done = probe.wait_for(lambda e: e["type"] == "response.done" and e["response_id"] == old, "cancelled done")
    assert done["status"] == "cancelled"
    # Explicit stops reached every stage: the old epoch's requests and codec state are gone
    # while the session itself stays open. The Thinker holds the new epoch's request alone: its
    # setup (the session context) is prefilled at once, before the user's next unit.
    idle = {**STAGE_IDLE, **{key: baseline.gauges[key] for key in WHOLE_KV}}
    idle[("requests", "thinker")] = 1.0
    idle[("kv_free_blocks", "thinker")] -= SESSION_KV_BLOCKS
    assert wait_for_gauges(reliability_server, idle) == idle
    probe.append(speech_units(2, seed=1))  # a new user turn, answered under the new epoch
    probe.append(silence_units(3))
    fresh = probe.wait_for(lambda e: e["type"] == "response.created" and e["response_id"] != old,
                           "a reply after the barge-in")
    assert fresh["response_id"].startswith(f"resp-{probe.session_id}-1-"), "the epoch did not advance"
    probe.end()
    events = probe.wait_closed()
    after = events[events.index(done) + 1:]
    assert not [e for e in after if e.get("response_id") == old], "output of the cancelled response leaked"
    assert events[-1]["type"] == "session.closed" and events[-1]["reason"] == "client"


# A client process that is killed mid-response: its TCP connection just ends (no stream cancel).
KILLED_CLIENT = """
import sys, numpy as np, tritonclient.grpc as g
url, sid = sys.argv[1], sys.argv[2]
client = g.InferenceServerClient(url)
def on_response(result, error):
    event = None if result is None else result.as_numpy("EVENT")
    if event is not None and b"response.audio.delta" in event[0]:
        print("audio", flush=True)
client.start_stream(callback=on_response)
def send(pcm, **kw):
    audio = g.InferInput("AUDIO", [pcm.size], "INT16"); audio.set_data_from_numpy(pcm)
    client.async_stream_infer("duplex", [audio], sequence_id=sid, enable_empty_final_response=True, **kw)
send(np.zeros(0, np.int16), sequence_start=True, request_id="down",
     parameters={"initial_user_text": "Tell me a story.", "reply_units": 4, "reply_tokens_per_unit": 2})
send(np.zeros(4 * 16000, np.int16))
sys.stdin.read()
"""


def _killed_mid_response(url: str, session_id: str) -> None:
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url, session_id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "audio", "the killed client never heard audio"
    finally:
        client.kill()
        client.wait()


def _freed_before(server, baseline, deadline: float) -> bool:
    """Whether every tracked gauge was back at `baseline` in a snapshot read before `deadline`
    (time.monotonic()): a snapshot's values are at least as old as the moment its reading ended."""
    while True:
        snapshot = ServerResources.take(server)
        read_by = time.monotonic()
        if snapshot.tracked() == baseline.tracked():
            return read_by < deadline
        if read_by >= deadline:
            return False
        time.sleep(0.25)


@pytest.mark.parametrize("how", ["cancel", "kill"])
def test_client_gone_mid_response_is_reaped_and_freed(reliability_server, baseline, probes, how):
    """The client cancels its stream (`cancel`) or its process dies (`kill`) while the model
    speaks: the reaper closes the session before the idle timeout could, and every stage
    request, KV block and codec state goes back. The session's last activity is its last
    request, sent after `last_send`: idle reaping cannot free it before last_send + the idle
    timeout, so everything freed before then was freed by the client-gone close."""
    session_id = f"gone-{how}-{uuid.uuid4().hex[:6]}"
    last_send = time.monotonic()
    if how == "kill":
        _killed_mid_response(reliability_server.grpc_url, session_id)
    else:
        probe = probes(session_id)
        probe.start(**REPLY)
        last_send = time.monotonic()
        probe.append(silence_units(4))
        _first_audio(probe)
        probe.drop()
    freed = _freed_before(reliability_server, baseline, last_send + IDLE_TIMEOUT_S)
    assert freed, "not reaped before the idle timeout could do it"
    again = probes(session_id)  # the id is free again, and so is its sequence slot
    again.start()
    assert again.wait_type("session.created")["session_id"] == session_id


def test_idle_session_is_reaped_with_reason_idle(probes):
    """Reaped once the idle timeout has passed, by the open session's limit: well before the
    longer limit of a session that is closing (CLOSING_GRACE times the timeout)."""
    probe = probes()
    started = time.monotonic()
    probe.start()
    closed = probe.wait_type("session.closed", timeout_s=IDLE_TIMEOUT_S * CLOSING_GRACE)
    waited = time.monotonic() - started
    assert closed["reason"] == "idle"
    assert IDLE_TIMEOUT_S <= waited < IDLE_TIMEOUT_S * CLOSING_GRACE, waited
    probe.wait_closed(timeout_s=30)


def _admitted_run(url: str, storm: bool) -> tuple[list[float], list[float]]:
    """Four sessions (the limit) each get a reply; with `storm`, START requests over the limit
    keep arriving meanwhile. Returns the admitted sessions' server TTFPs and the refusal times."""
    admitted = [SessionProbe(url) for _ in range(4)]
    for probe in admitted:
        probe.start(**REPLY)
        probe.wait_type("session.created")
    refusals: list[float] = []
    stop = threading.Event()
    storm_thread = threading.Thread(target=_storm, args=(url, stop, refusals))
    if storm:
        storm_thread.start()
    for probe in admitted:
        probe.append(silence_units(2))
    ttfps = [float(_first_audio(probe)["ttfp_ms"]) for probe in admitted]
    stop.set()
    if storm:
        storm_thread.join(30)
    for probe in admitted:
        probe.wait_type("response.done")
        probe.close()
        assert "error" not in probe.types(), probe.events
    return ttfps, refusals


def _storm(url: str, stop: threading.Event, refusals: list[float]) -> None:
    while not stop.is_set():
        probe = SessionProbe(url)
        started = time.monotonic()
        probe.start()
        event = probe.wait_type("error", timeout_s=10)
        refusals.append(time.monotonic() - started)
        assert event["code"] == "resource_exhausted", event
        probe.close()  # no END: the refusal freed the sequence slot itself


def test_admission_refuses_at_once_and_admitted_sessions_keep_their_latency(reliability_server):
    calm, _ = _admitted_run(reliability_server.grpc_url, storm=False)
    stormy, refusals = _admitted_run(reliability_server.grpc_url, storm=True)
    assert len(refusals) >= 4, "the storm never ran"
    # A refused START touches no stage: it is answered sooner than an admitted session's first
    # audio (stage work) measured under the same load, at the same time.
    assert 1000.0 * statistics.median(refusals) < statistics.median(stormy), (refusals, stormy)
    bound = TTFP_STORM_FACTOR * statistics.median(calm) + TTFP_STORM_SLACK_MS
    assert statistics.median(stormy) <= bound, (calm, stormy)
