"""Stopping the gateway (SIGTERM) closes every session with the reason server_shutdown, ENDs
its duplex session, tells a queued connection the same, and exits at once; the server holds
nothing afterwards."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from openbmb_realtime import RealtimeError, SessionClosed
from websockets.asyncio.client import connect as ws_connect

from gateway_settings import API_KEY, CAPACITY

from gateway_process import GatewayProcess
from sdk_helpers import collect, connect
from server_gauges import held, settle

pytestmark = pytest.mark.server


def test_shutdown_closes_sessions_and_the_queue_with_a_reason(server, tmp_path):
    gateway = GatewayProcess(server.grpc_url, tmp_path, ["--init-timeout-s", "1", "--pause-timeout-s", "1"])

    async def scenario():
        assert await _init_timeout(gateway) == ("init_timeout", "error")
        assert await _pause_timeout(gateway) == ["queue_done", "prepared", "paused", "timeout"]
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


async def _init_timeout(gateway) -> tuple[str, str]:
    """A connection that never sends its init: an error and the close, after the init timeout."""
    async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=audio&model=m", subprotocols=["map.realtime"],
                          additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        events = [json.loads(message) async for message in ws]
    error = next(event for event in events if event["type"] == "error")
    return error["error"]["code"], events[-1]["reason"]


async def _pause_timeout(gateway) -> list[str]:
    """A demo session paused past the pause timeout: `timeout`, and the session is over."""
    async with ws_connect(f"{gateway.ws_url}/ws/duplex/adx_pause", subprotocols=["minicpmo.duplex",
                                                                                 f"apikey.{API_KEY}"]) as ws:
        kinds = [json.loads(await ws.recv())["type"]]
        await ws.send(json.dumps({"type": "prepare", "system_prompt": "Hi."}))
        kinds.append(json.loads(await ws.recv())["type"])
        await ws.send(json.dumps({"type": "pause"}))
        kinds += [json.loads(message)["type"] async for message in ws]
    return kinds
