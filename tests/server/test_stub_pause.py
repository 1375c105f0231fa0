"""A stub process paused while the server hands it a request (backends/serving/stub_wait_patch.py).

Triton 2.51's Python backend waited one second for a stub's receipt of a request; a stub paused
longer than that (a saturated or frozen machine) made it give up on the request, and the stub's
late answer then aborted the whole server. Paused here with SIGSTOP for 2.5 s, well past the
old wait and well inside the patched one: the request is answered once the stub runs again,
the server and its stubs live on, and sessions still work.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
from server_resources import ServerResources, settled
from session_probe import silence_units
from stage_calls import StageCall, StageEndpoint, call

from backends.contracts.messages import stop_request
from perf.soak_processes import stub_of

PAUSE_S = 2.5


@pytest.mark.parametrize("model", ["code2wav", "thinker"])
def test_a_request_handed_to_a_paused_stub_is_answered_and_the_server_lives(reliability_server, baseline,
                                                                          probes, model):
    stages = StageEndpoint.of(reliability_server)
    stub = stub_of(reliability_server.process.pid, model)
    os.kill(stub, signal.SIGSTOP)
    try:
        pending = StageCall(stages, model, stop_request(model, f"paused-{model}.e0"), None)
        time.sleep(PAUSE_S)
    finally:
        os.kill(stub, signal.SIGCONT)
    answer = pending.wait()
    assert answer.error is None and answer.responses == 1, answer
    assert reliability_server.exited() is None, reliability_server.log_tail()
    assert call(stages, model, stop_request(model, f"after-{model}.e0")).error is None
    probe = probes()
    probe.start(initial_user_text="Hello.", reply_units=1, reply_tokens_per_unit=2)
    probe.append(silence_units(3))
    probe.wait_type("response.done")
    probe.close()
    assert ServerResources.take(reliability_server).stubs == baseline.stubs, "a stub was restarted"
    settled(reliability_server, baseline)
