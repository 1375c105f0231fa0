"""A CI-sized subset of the gateway's bad-input fuzzing (perf/fuzz_gateway.py runs >= 1000 cases
with a seed): 100 cases of both protocols against the shared gateway, then the canary's reply
turn and no session, queue entry or server resource left held."""
from __future__ import annotations

import pytest

from gateway_settings import API_KEY, SESSION_DEFAULTS
from perf.fuzz_gateway import GatewayHarness, MAX_MESSAGE_BYTES, run_batch
from perf.fuzz_gateway_oracle import SESSION_DEFAULTS as ORACLE_DEFAULTS

pytestmark = pytest.mark.server

CASES, SEED = 100, 20261207


def test_the_fixture_runs_the_gateway_as_the_oracle_assumes():
    assert SESSION_DEFAULTS == [f"{name}={value}" for name, value in ORACLE_DEFAULTS.items()]
    assert MAX_MESSAGE_BYTES == 262144


def test_bad_input_is_answered_as_documented_and_nothing_is_held(server, gateway):
    harness = GatewayHarness(gateway.ws_url, API_KEY, f"http://{server.options.address}:{server.metrics_port}",
                             alive=lambda: server.process.poll() is None and gateway.process.poll() is None)
    try:
        run_batch(harness, CASES, SEED)
    finally:
        harness.finish()
    assert not harness.report.failures, "\n".join(harness.report.failures)
    assert harness.report.cases.total() == CASES
