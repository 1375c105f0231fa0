"""The CI-sized subset of the front door's property-based bad input (the nightly-style run with
1000 cases and a seed is `python -m perf.fuzz_duplex`): the same generator and checks, a fixed
set of cases (derandomized), on the shared server.

Per case: every request gets what the contract says (an error, clear, or a normal answer; a
stage request without the stage secret gets `[forbidden]`), the server stays ready and the
fuzz session survives what did not END it. After the batch a canary session opened before it
completes a reply turn, and the resource gauges return to their idle baseline.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from perf.fuzz_duplex import Harness, clarity_problem
from perf.fuzz_inputs import Case, cases

pytestmark = pytest.mark.server

CASES = 120


@pytest.fixture(scope="module")
def harness(server):
    metrics = f"http://{server.options.address}:{server.metrics_port}"
    made = Harness(server.grpc_url, metrics, server.stage_secret, alive=lambda: server.process.poll() is None)
    yield made
    made.finish()  # once: a no-op after the last test's


@settings(max_examples=CASES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(case=cases(conflicting_starts=False))  # see perf.fuzz_inputs.cases
def test_every_bad_request_gets_a_clear_answer(harness, case: Case):
    problem = harness.run(case)
    assert problem is None, f"{problem}\n{case!r}"


def test_after_the_batch_the_canary_talks_and_nothing_is_held(harness):
    assert harness.report.cases.total() >= CASES
    assert len(harness.report.cases) == 8, harness.report.cases  # every category ran
    assert harness.finish() == []


@pytest.mark.parametrize("message,clear", [
    ("[invalid_argument] session 'a': unknown action 'x'", True),
    ("[request id: fz-1] unexpected inference input 'junk' for model 'duplex'", True),
    ("[internal] internal error: KeyError", False),
    ("Traceback (most recent call last):\n  File ...", False),
    ("[surprise] something", False),
    ("  ", False),
])
def test_clarity_of_error_messages(message, clear):
    assert (clarity_problem(message) is None) == clear
