"""100 Realtime sessions of random fates (a dropped socket, a close, an interrupt, an idle
connection that never starts) through the gateway, several at once past its capacity: afterwards
nothing is held, neither in the gateway (sessions, queue) nor in the server (its resource gauges)."""
from __future__ import annotations

import asyncio
import json
import random

import numpy as np
import pytest
from openbmb_realtime import RealtimeError
from websockets.asyncio.client import connect as ws_connect

from gateway_settings import API_KEY
from sdk_helpers import connect, speech_then_silence
from server_gauges import held, settle

pytestmark = pytest.mark.server
SESSIONS = 100
AT_ONCE = 6  # past the capacity of 3: the queue takes part
AUDIO = speech_then_silence(0.0)[:16000]  # 1 s of speech


async def _dropped(url: str, rng: random.Random) -> None:
    async with ws_connect(f"{url}/v1/realtime?mode=audio&model=m", subprotocols=["map.realtime"],
                          additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        while (event := json.loads(await ws.recv()))["type"] != "session.queue_done":
            if event["type"] == "error":
                raise RealtimeError(event["error"]["code"], event["error"]["message"], "connecting")
        await ws.send(json.dumps({"type": "session.init", "payload": {}}))
        if rng.random() < 0.5:
            await ws.recv()
        # leaving the block closes the socket: no session.close


async def _idle(url: str, rng: random.Random) -> None:
    async with ws_connect(f"{url}/v1/realtime?mode=audio&model=m", subprotocols=["map.realtime"],
                          additional_headers={"Authorization": f"Bearer {API_KEY}"}):
        await asyncio.sleep(rng.uniform(0.0, 0.5))


async def _closed(url: str, rng: random.Random, interrupt: bool) -> None:
    session = await connect(url, API_KEY)
    chunk = AUDIO[: int(rng.uniform(0.1, 1.0) * AUDIO.size)]
    await session.send_audio(chunk.tobytes())
    if interrupt:
        session.interrupt()
        await session.send_audio(np.zeros(1600, np.float32).tobytes())
    await session.close()


async def _fate(url: str, rng: random.Random, gate: asyncio.Semaphore) -> str:
    fate = rng.choice(["drop", "close", "interrupt", "idle"])
    async with gate:
        if fate == "drop":
            await _dropped(url, rng)
        elif fate == "idle":
            await _idle(url, rng)
        else:
            await _closed(url, rng, interrupt=fate == "interrupt")
    return fate


def test_random_fates_leave_nothing_held(gateway, server):
    async def scenario():
        rng, gate = random.Random(50), asyncio.Semaphore(AT_ONCE)
        return await asyncio.gather(*[_fate(gateway.ws_url, random.Random(rng.random()), gate)
                                      for _ in range(SESSIONS)], return_exceptions=True)

    fates = asyncio.run(asyncio.wait_for(scenario(), 180))
    # A connection may find the bounded queue full (sessions whose clients left hold their slot
    # until the server has closed them): a refusal, not a failure.
    refused = [fate for fate in fates if isinstance(fate, RealtimeError) and fate.code == "queue_full"]
    failed = [repr(fate) for fate in fates if isinstance(fate, BaseException) and fate not in refused]
    assert not failed, failed
    assert len(refused) < SESSIONS // 5 and len(set(fates) - set(refused)) == 4
    in_gateway = settle(lambda: {name: value for name, value in gateway.metrics().items()
                                 if name.startswith(("minicpmo_gateway_sessions", "minicpmo_gateway_queue_length"))
                                 and value != 0})
    assert not in_gateway, in_gateway
    assert not settle(lambda: held(server)), held(server)
