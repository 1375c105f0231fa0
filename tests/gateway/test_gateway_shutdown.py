"""Stopping the gateway (SIGTERM) closes every session with the reason server_shutdown, ENDs
its duplex session, tells a queued connection the same, and exits at once; the server holds
nothing afterwards."""
from __future__ import annotations

import asyncio
import time

import pytest
from openbmb_realtime import RealtimeError, SessionClosed

from conftest import API_KEY, CAPACITY, GatewayProcess
from sdk_helpers import collect, connect
from server_gauges import held, settle

pytestmark = pytest.mark.server


def test_shutdown_closes_sessions_and_the_queue_with_a_reason(server, tmp_path):
    gateway = GatewayProcess(server.grpc_url, tmp_path)

    async def scenario():
        sessions = [await connect(gateway.ws_url, API_KEY) for _ in range(CAPACITY)]
        queued = asyncio.ensure_future(connect(gateway.ws_url, API_KEY))
        while gateway.metrics().get("minicpmo_gateway_queue_length") != 1:
            await asyncio.sleep(0.05)
        started = time.monotonic()
        code = await asyncio.to_thread(gateway.stop)
        stop_s = time.monotonic() - started
        closed = [(await collect(session, until=lambda e: isinstance(e, SessionClosed))).of(SessionClosed)
                  for session in sessions]
        with pytest.raises(RealtimeError) as refused:
            await queued
        return code, stop_s, closed, refused.value

    code, stop_s, closed, refused = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert code == 0 and stop_s < 5.0
    assert [events[-1].reason for events in closed] == ["server_shutdown"] * CAPACITY
    assert refused.code == "session_closed_before_ready"
    assert not settle(lambda: held(server)), held(server)
