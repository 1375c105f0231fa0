"""Stopping the gateway (SIGTERM) closes every session with the reason server_shutdown, ENDs
its duplex session, and exits; the server holds nothing afterwards."""
from __future__ import annotations

import asyncio

import pytest
from openbmb_realtime import SessionClosed

from conftest import API_KEY, GatewayProcess
from sdk_helpers import collect, connect
from server_gauges import held, settle

pytestmark = pytest.mark.server


def test_shutdown_closes_sessions_with_a_reason(server, tmp_path):
    gateway = GatewayProcess(server.grpc_url, tmp_path)

    async def scenario():
        sessions = [await connect(gateway.ws_url, API_KEY) for _ in range(2)]
        code = await asyncio.to_thread(gateway.stop)
        closed = [(await collect(session, until=lambda e: isinstance(e, SessionClosed))).of(SessionClosed)
                  for session in sessions]
        return code, closed

    code, closed = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert code == 0
    assert [events[-1].reason for events in closed] == ["server_shutdown", "server_shutdown"]
    assert not settle(lambda: held(server)), held(server)
