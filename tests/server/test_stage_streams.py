"""The orchestrator's stage streams on a real server (backends/serving/grpc_stages.py): a
session's stage calls leave their streams open for the next call, and streams nobody uses close
after the idle time, so an idle server holds none (what the leak tests' baselines rely on)."""
from __future__ import annotations

import time

from server_resources import ServerResources, wait_for_gauges
from session_probe import silence_units

from backends.serving.grpc_stages import DEFAULT_STREAM_IDLE_S

IDLE_STREAMS = ("stage_idle_streams", "duplex")
REPLY = {"initial_user_text": "Hello.", "reply_units": 1, "reply_tokens_per_unit": 2}
SEEN_WITHIN_S = 10.0


def _wait_for_open_streams(server, timeout_s: float) -> float:
    """The most idle streams seen by the time one shows up (or the timeout)."""
    deadline, most = time.monotonic() + timeout_s, 0.0
    while most < 1.0 and time.monotonic() < deadline:
        most = max(most, ServerResources.take(server).gauges.get(IDLE_STREAMS, 0.0))
        time.sleep(0.1)
    return most


def test_calls_leave_streams_open_and_idle_ones_close(reliability_server, probes):
    probe = probes()
    probe.start(**REPLY)
    probe.append(silence_units(3))
    probe.wait_type("response.done")
    probe.append(silence_units(1))  # one more Thinker call while the session listens
    assert _wait_for_open_streams(reliability_server, SEEN_WITHIN_S) >= 1.0, "no stage stream stayed open"
    probe.close()
    # closed within the idle time, the closer's period and a gauge publication (0.5 s)
    closed = wait_for_gauges(reliability_server, {IDLE_STREAMS: 0.0}, timeout_s=DEFAULT_STREAM_IDLE_S + 8.0)
    assert closed == {IDLE_STREAMS: 0.0}
