"""No leaks after 200 sessions that end every way a session can end
(docs/architecture.md edge case 8).

Strategy: 200 tiny sessions (1-2 units, sent at once), 4 at a time, on the reliability server.
Each draws its fate from a seeded RNG: a completed reply, a barge-in, a client that drops its
stream mid-response (no END), a fault inside one of the three stages, a bad request inside a
live session, or a listen-only session. More sessions drop their stream than Triton has
sequence slots (4 * max_sessions + 16 = 32), so a session that did not give its slot back
would stall later STARTs. Afterwards every tracked gauge (open sessions, orchestrator threads,
stage request tables, free KV blocks, codec states) must be back at its warm baseline, the
shared-memory segments the server's processes map (Python-backend regions included) must be
the same files at the same sizes, no new file in /dev/shm may be left unmapped (a segment
nobody unlinked), no orchestrator thread may be stuck in a stage call, and no stub process
may have died.
"""
from __future__ import annotations

import random
import threading
import time
import uuid

import numpy as np
from server_resources import dev_shm, orphan_segments, settled, warm_baseline
from session_probe import SessionProbe, silence_units

from backends.serving.fault_injection import fault_marker
from backends.serving.grpc_stages import DEFAULT_MAX_IDLE

NUM_SESSIONS = 200
CONCURRENCY = 4
SEED = 1234
FATES = ("reply", "reply", "barge_in", "drop", "drop", "fault", "bad_request", "listen")
REPLY = {"initial_user_text": "Hello.", "reply_units": 1, "reply_tokens_per_unit": 2}
MAX_REFUSALS = 100
REFUSED_RETRY_S = 0.1  # the reaper looks for gone clients every 0.5 s


def _reply(probe: SessionProbe, rng: random.Random) -> None:
    probe.start(seed=rng.randrange(1000), **REPLY)
    probe.append(silence_units(rng.choice((1, 2))))
    probe.wait_type("response.done")
    probe.end()


def _barge_in(probe: SessionProbe, rng: random.Random) -> None:
    probe.start(**{**REPLY, "reply_units": 3})
    probe.append(silence_units(2))
    probe.wait_type(rng.choice(("response.created", "response.audio.delta")))
    probe.cancel()
    probe.wait_for(lambda e: e["type"] == "response.done" and e["status"] == "cancelled", "cancelled")
    probe.end()


def _drop(probe: SessionProbe, rng: random.Random) -> None:
    probe.start(**{**REPLY, "reply_units": 3})
    probe.append(silence_units(2))
    probe.wait_type(rng.choice(("session.created", "response.created", "response.audio.delta")))
    probe.drop()


def _fault(probe: SessionProbe, rng: random.Random) -> None:
    probe.start(**REPLY)
    probe.append(silence_units(2))
    probe.wait_type("error")
    if rng.random() < 0.5:
        probe.end()
    else:
        probe.drop()


def _bad_request(probe: SessionProbe, rng: random.Random) -> None:
    probe.start(**REPLY)
    probe.append(silence_units(1), action=rng.choice(("dance", "append")), sample_rate=rng.choice((8000, 16000)))
    probe.append(np.zeros(16000 * 11, np.int16))  # over the 10 s append limit
    probe.append(silence_units(1))
    probe.end()


def _listen(probe: SessionProbe, rng: random.Random) -> None:
    probe.start()
    probe.append(silence_units(rng.choice((1, 2))))
    probe.end()


PLAYS = {"reply": _reply, "barge_in": _barge_in, "drop": _drop, "fault": _fault,
         "bad_request": _bad_request, "listen": _listen}


def _session_id(fate: str, rng: random.Random) -> str:
    if fate == "fault":
        return f"leak-{fault_marker(rng.choice(('thinker', 'talker', 'code2wav')))}-{uuid.uuid4().hex[:8]}"
    return f"leak-{fate}-{uuid.uuid4().hex[:8]}"


def _play(url: str, fate: str, rng: random.Random, outcomes: dict[str, int], lock: threading.Lock) -> None:
    """One session of `fate`; a START refused for want of a slot is retried (a dropped session
    holds its slot until the reaper sees the cancelled stream), and counted."""
    for _ in range(MAX_REFUSALS):
        if _attempt(url, fate, rng):
            with lock:
                outcomes[fate] = outcomes.get(fate, 0) + 1
            return
        with lock:
            outcomes["refused"] = outcomes.get("refused", 0) + 1
        time.sleep(REFUSED_RETRY_S)
    raise AssertionError(f"{fate}: refused {MAX_REFUSALS} times in a row")


def _attempt(url: str, fate: str, rng: random.Random) -> bool:
    """False when the START was refused with resource_exhausted."""
    probe = SessionProbe(url, _session_id(fate, rng))
    try:
        PLAYS[fate](probe, rng)
        if not probe.dropped:
            probe.wait_closed()
        return True
    except AssertionError:
        if any(e["type"] == "error" and e.get("code") == "resource_exhausted" for e in probe.events):
            return False
        raise
    finally:
        probe.close()


def _run_all(url: str) -> dict[str, int]:
    rng = random.Random(SEED)
    plan = [(rng.choice(FATES), random.Random(rng.random())) for _ in range(NUM_SESSIONS)]
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(jobs: list) -> None:
        for fate, session_rng in jobs:
            try:
                _play(url, fate, session_rng, outcomes, lock)
            except BaseException as exc:  # collected: the other workers finish their share
                errors.append(exc)

    workers = [threading.Thread(target=worker, args=(plan[i::CONCURRENCY],)) for i in range(CONCURRENCY)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if errors:
        raise errors[0]
    return outcomes


def test_edge_case_8_200_sessions_of_every_fate_leave_nothing_behind(reliability_server):
    baseline = warm_baseline(reliability_server)
    shm_before = dev_shm()
    outcomes = _run_all(reliability_server.grpc_url)
    played = sum(n for fate, n in outcomes.items() if fate != "refused")
    assert played == NUM_SESSIONS and outcomes.get("drop", 0) > 32, outcomes
    after = settled(reliability_server, baseline)
    # A session thread blocked in a stage call that never ends (a lost FINAL) is a leak.
    assert after.stranded == 0, f"{after.stranded} session threads stuck in a stage call"
    assert after.tracked() == baseline.tracked(), outcomes
    # Pooled stage channels stay (reused by later sessions), bounded by the pool's idle cap.
    assert after.gauges[("stage_channels", "duplex")] <= 3 * DEFAULT_MAX_IDLE
    assert after.shm == baseline.shm, "shared-memory segments of the server changed"
    assert orphan_segments(shm_before) == [], "segments in /dev/shm that no process maps"
    assert after.stubs == baseline.stubs, "a stub process died or was replaced"
