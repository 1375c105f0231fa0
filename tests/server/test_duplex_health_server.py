"""The `duplex` health probe on a real tritonserver (a server of its own: its stubs get killed).

- Probes are answered at once, free their sequence slot at once, and open no session: after
  more probes than the model has sequence slots (a leaked slot each would leave the last ones
  waiting in Triton's backlog for good), `max_sessions` sessions are admitted, one more START is
  refused at once, and the session counter moved by exactly those sessions.
- The probe mark on anything but the exact probe form is refused as an unknown parameter, by
  the session manager, and holds no slot either.
- A SIGKILLed `duplex` stub (Triton 2.51 neither restarts it nor stops calling it ready) makes
  the probe report `duplex` down within seconds and the launcher's readiness false; a killed
  stage stub does the same for its stage. This is last: the module's server stays broken.

Strategy: stubs are told apart by their command line, which names the model's model.py.
"""
from __future__ import annotations

import os
import signal
import time
import urllib.request

import numpy as np
import pytest

from backends.serving.duplex_health import HEALTH_PARAMETER, ask_duplex
from backends.serving.health import OK, probe
from backends.serving.metrics_catalog import parse_samples, sample_sum
from perf.soak_processes import stub_of
from session_probe import SessionProbe

PROMPT_S = 2.0  # a probe, or a refusal, is answered within this
NOTICE_S = 10.0  # a killed stub shows in the probe within this
WAIT_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of its own: the last test kills its stubs."""
    from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    from server_args import TEST_EXIT_ARGS

    options = ServerOptions(profile=get_profile("cpu"), workdir=PROJECT_ROOT / "var",
                            log_file=tmp_path_factory.mktemp("duplex-health") / "server.log",
                            extra_args=TEST_EXIT_ARGS)
    with ServerProcess(options) as proc:
        yield proc


def _slots(server) -> int:
    return int(server.options.profile.template_vars()["sequence_slots"])


def _sessions_opened(server) -> float:
    url = f"http://{server.options.address}:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return sample_sum(parse_samples(resp.read().decode()), "minicpmo_sessions_opened_total")


def _timed_probe(server) -> float:
    start = time.monotonic()
    assert ask_duplex(server.grpc_url, timeout_s=WAIT_S) is None
    return time.monotonic() - start


def _refused_code(server, start: bool = True, end: bool = True, audio: np.ndarray | None = None,
                  **params: object) -> str:
    session = SessionProbe(server.grpc_url)
    try:
        session.stream.send(audio, start=start, end=end, **{HEALTH_PARAMETER: True, **params})
        event = session.wait_for(lambda e: True, "the answer to a marked START", timeout_s=WAIT_S)
        return str(event.get("code", event["type"]))
    finally:
        session.drop()


def test_probes_are_answered_at_once_and_hold_no_slot_and_no_session(server):
    assert server.is_ready()
    opened = _sessions_opened(server)
    slow = [round(s, 2) for s in (_timed_probe(server) for _ in range(2 * _slots(server) + 4)) if s >= PROMPT_S]
    assert not slow, f"probes answered late (a slot leaked?): {slow}"
    _admits_max_sessions_then_refuses(server)
    deadline = time.monotonic() + WAIT_S
    while _sessions_opened(server) < opened + server.options.profile.max_sessions and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sessions_opened(server) == opened + server.options.profile.max_sessions, "a probe counted as a session"


def _admits_max_sessions_then_refuses(server) -> None:
    sessions = [SessionProbe(server.grpc_url) for _ in range(server.options.profile.max_sessions + 1)]
    try:
        for session in sessions[:-1]:
            session.start()
            session.wait_type("session.created", timeout_s=WAIT_S)
        started = time.monotonic()
        sessions[-1].start()
        refusal = sessions[-1].wait_type("error", timeout_s=WAIT_S)
        assert refusal["code"] == "resource_exhausted" and time.monotonic() - started < PROMPT_S, refusal
    finally:
        for session in sessions:
            session.close()


def test_the_mark_on_anything_else_is_refused_and_holds_no_slot(server):
    for _ in range(_slots(server) + 1):  # a leaked slot each would leave the last waiting
        assert _refused_code(server, end=False) == "invalid_argument"  # START alone
    assert _refused_code(server, audio=np.zeros(1600, np.int16)) == "invalid_argument"
    assert _refused_code(server, instructions="be brief") == "invalid_argument"
    assert _timed_probe(server) < PROMPT_S


def _down_within(server, model: str) -> dict[str, str]:
    deadline = time.monotonic() + NOTICE_S
    while True:
        report = probe(server.http_url, server.grpc_url, timeout_s=5)
        if report.models[model] != OK or time.monotonic() > deadline:
            return report.models
        time.sleep(0.2)


def test_a_killed_stub_makes_its_model_not_ready(server):
    """Last in this module: the server keeps its killed stubs until the module ends."""
    assert probe(server.http_url, server.grpc_url).ready and server.is_ready()
    os.kill(stub_of(server.process.pid, "duplex"), signal.SIGKILL)
    models = _down_within(server, "duplex")
    assert [m for m, state in models.items() if state != OK] == ["duplex"], models
    # the server's hand-off to a dead stub ends after its ten-second wait
    # (backends/serving/stub_wait_patch.py), so the probe's own timeout usually tells first
    assert "not healthy" in models["duplex"] or "no answer" in models["duplex"], models
    assert not server.is_ready()
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200, "Triton alone still calls it ready: the gap the duplex probe closes"
    os.kill(stub_of(server.process.pid, "talker"), signal.SIGKILL)
    models = _down_within(server, "talker")
    assert sorted(m for m, state in models.items() if state != OK) == ["duplex", "talker"], models
