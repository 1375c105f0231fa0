"""Admission on a real server: no START waits silently and refused STARTs hold no sequence
slot, and a session's uplink audio is bounded.

- STARTs refused by the dozen (more than the sequence batcher has slots) and never ENDed by
  their client leave every slot free: the next valid START is created at once.
- More STARTs at once than there are slots: each is answered promptly (created, or refused with
  `resource_exhausted`) while the admitted sessions stay open; before, the ones past the slots
  waited in Triton's backlog until a session ended.
- An audio flood is refused past the bound request by request while another session's units
  keep flowing; the flooded session goes on, and what it held is freed when its client goes.

Strategy: the STARTs ride one raw gRPC stream with distinct sequence ids, and the arrival of
each START's first answer is stamped on the stream thread. Waits are generous; the one timing
bound is the promptness the contract promises (docs/duplex_contract.md, Errors).
"""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from conftest import RELIABILITY_OVERRIDES
from server_resources import settled
from session_probe import SessionProbe, silence_units

from backends.serving.profiles import get_profile
from client.stream_close import stop_stream

PROMPT_S = 1.0  # every START is answered within this (created or refused)
WAIT_S = 30.0
PROFILE = get_profile("cpu").with_overrides(RELIABILITY_OVERRIDES)
SLOTS = int(PROFILE.template_vars()["sequence_slots"])
UNIT = 16000
FLOOD_APPENDS = 30  # 1 s each, sent at once: 6 times the 5 s bound


@dataclass
class StartBurst:
    """STARTs of many sessions on one stream: the first answer of each, stamped on arrival."""

    url: str
    prefix: str = field(default_factory=lambda: f"adm-{uuid.uuid4().hex[:6]}")
    answers: "queue.Queue[tuple[str, float, dict | None, str | None]]" = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.client = grpcclient.InferenceServerClient(self.url)
        self.client.start_stream(callback=self._on_response)
        self.sent: dict[str, float] = {}

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.answers.put((getattr(error, "request_id", "") or "", time.monotonic(), None, str(error)))
            return
        raw = result.as_numpy("EVENT")
        event = None if raw is None else json.loads(raw[0])
        self.answers.put((result.get_response().id, time.monotonic(), event, None))

    def start(self, count: int, **params) -> None:
        for index in range(count):
            sid = f"{self.prefix}-{index}"
            self.sent[sid] = time.monotonic()
            self.client.async_stream_infer("duplex", [], request_id=sid, sequence_id=sid, sequence_start=True,
                                           enable_empty_final_response=True, parameters=params or None)

    def first_answers(self) -> dict[str, tuple[float, dict]]:
        """{session id: (seconds from its START to its first event, that event)} for every START."""
        first: dict[str, tuple[float, dict]] = {}
        deadline = time.monotonic() + WAIT_S
        while len(first) < len(self.sent):
            try:
                rid, arrived, event, error = self.answers.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                missing = sorted(set(self.sent) - set(first))
                raise AssertionError(f"{len(missing)} STARTs never answered: {missing[:5]}") from None
            assert error is None, error
            if event is not None and rid not in first:
                first[rid] = (arrived - self.sent[rid], event)
        return first

    def end(self, session_ids: list[str]) -> None:
        for sid in session_ids:
            self.client.async_stream_infer("duplex", [], request_id=f"{sid}-end", sequence_id=sid,
                                           sequence_end=True, enable_empty_final_response=True)

    def drop(self) -> None:
        """Disconnect: no END for anything."""
        stop_stream(self.client, cancel=True)
        self.client.close()


def _created(answers: dict[str, tuple[float, dict]]) -> list[str]:
    return [sid for sid, (_, event) in answers.items() if event["type"] == "session.created"]


def test_refused_starts_that_never_end_hold_no_slot(reliability_server, probes):
    burst = StartBurst(reliability_server.grpc_url)
    burst.start(SLOTS + 8, reply_units=-1)  # each refused: invalid_argument
    answers = burst.first_answers()
    assert {event["code"] for _, event in answers.values()} == {"invalid_argument"}
    burst.drop()
    probe = probes()
    started = time.monotonic()
    probe.start()
    probe.wait_type("session.created", timeout_s=WAIT_S)
    assert time.monotonic() - started < PROMPT_S, "a valid START waited for a slot"


def test_more_starts_than_slots_at_once_are_all_answered_promptly(reliability_server):
    burst = StartBurst(reliability_server.grpc_url)
    burst.start(SLOTS + 16)
    answers = burst.first_answers()  # while the admitted sessions stay open
    created = _created(answers)
    try:
        assert 1 <= len(created) <= PROFILE.max_sessions, created
        refusals = [event for sid, (_, event) in answers.items() if sid not in created]
        assert {event["code"] for event in refusals} == {"resource_exhausted"}
        slow = {sid: round(seconds, 2) for sid, (seconds, _) in answers.items() if seconds >= PROMPT_S}
        assert not slow, f"STARTs answered late: {slow}"
    finally:
        burst.end(created)
        time.sleep(0.5)  # the ENDs reach the server before the stream goes
        burst.drop()


def _listens(probe: SessionProbe) -> int:
    return probe.types().count("response.listen")


def test_an_uplink_flood_is_refused_past_the_bound_while_other_sessions_flow(reliability_server, baseline,
                                                                               probes):
    steady, flood = probes(), probes()
    for probe in (steady, flood):
        probe.start()
        probe.wait_type("session.created")
    flooding = threading.Thread(target=lambda: [flood.append(silence_units(1)) for _ in range(FLOOD_APPENDS)])
    flooding.start()
    for unit in range(1, 4):  # the other session's units keep being decided meanwhile
        steady.append(silence_units(1))
        steady.wait_for(lambda e: _listens(steady) >= unit, f"steady unit {unit} decided")
    flooding.join(WAIT_S)
    flood.wait_answered()
    assert steady.failures == [] and "error" not in steady.types()
    refused = len(flood.failures)
    assert 0 < refused <= FLOOD_APPENDS - 5, "the first 5 s are a burst the bound accepts"
    assert all("[resource_exhausted]" in failure for failure in flood.failures), flood.failures[:3]
    flood.wait_for(lambda e: flood.types().count("error") >= refused, "an error event per refused append")
    errors = [e for e in flood.events if e["type"] == "error"]
    assert len(errors) == refused and {e["code"] for e in errors} == {"resource_exhausted"}
    accepted = FLOOD_APPENDS - refused
    flood.wait_for(lambda e: _listens(flood) >= accepted, "the accepted units decided")
    flood.append(silence_units(1))  # the model took it all: the session goes on
    flood.wait_answered()
    assert len(flood.failures) == refused
    flood.drop()  # the client goes away; what the session held is freed
    steady.close()
    after = settled(reliability_server, baseline)
    assert after.tracked() == baseline.tracked()
    assert after.gauges[("uplink_audio_ms", "duplex")] == 0


def test_the_minimal_clients_burst_is_accepted(probes):
    """docs/duplex_contract.md's minimal client sends 5 s in 200 ms appends at once."""
    probe = probes()
    probe.start()
    probe.wait_type("session.created")
    for _ in range(25):
        probe.append(np.zeros(UNIT // 5, np.int16))
    probe.wait_answered()
    assert probe.failures == []
    probe.wait_for(lambda e: _listens(probe) >= 5, "every unit decided")
