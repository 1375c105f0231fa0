"""Realtime sessions through the gateway with the real SDK: interrupt (force_listen -> barge-in),
two concurrent sessions, and the admission queue: waiting past capacity with positions, hand-over
as a slot frees, and the bounded queue's refusal."""
from __future__ import annotations

import asyncio

import pytest
from openbmb_realtime import AudioDelta, RealtimeError, SessionQueued, TextDelta

from gateway_settings import API_KEY, CAPACITY
from recording_socket import RecordingFactory
from sdk_helpers import client, collect, connect, send_paced, speech_then_silence

pytestmark = pytest.mark.server
MAX_WAITING = 4  # the fixture's --max-waiting


def run(coro, timeout_s: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_interrupt_cancels_the_reply_and_the_session_goes_on(gateway):
    async def scenario():
        factory = RecordingFactory()
        session = await client(gateway.ws_url, API_KEY, websocket_factory=factory).audio.connect(model="m")
        audio = speech_then_silence(12.0)
        sender = asyncio.ensure_future(send_paced(session, audio))
        await collect(session, until=lambda event: isinstance(event, AudioDelta))
        session.interrupt()  # the next append carries force_listen
        await collect(session)
        sender.cancel()
        await session.close()
        return factory.sockets[0]

    raw = run(scenario())
    done = raw.of("response.done")
    assert done and done[0]["response"]["status"] == "cancelled", done
    assert raw.of("session.closed")[-1]["reason"] == "user_stop"


def test_two_concurrent_sessions_both_get_replies(gateway):
    async def one():
        session = await connect(gateway.ws_url, API_KEY)
        sender = asyncio.ensure_future(send_paced(session, speech_then_silence(8.0)))
        got = await collect(session)
        sender.cancel()
        await session.close()
        return got

    async def both():
        return await asyncio.gather(one(), one())

    for got in run(both()):
        assert got.of(TextDelta) and got.of(AudioDelta)


def test_queue_past_capacity_then_hand_over_and_bound(gateway):
    async def scenario():
        holders = [await connect(gateway.ws_url, API_KEY) for _ in range(CAPACITY)]
        waiter_sockets = RecordingFactory()
        waiters = [asyncio.ensure_future(client(gateway.ws_url, API_KEY, websocket_factory=waiter_sockets)
                                         .audio.connect(model="m")) for _ in range(MAX_WAITING)]
        await _until(lambda: gateway.metrics().get("minicpmo_gateway_queue_length") == MAX_WAITING)
        with pytest.raises(RealtimeError) as refused:
            await connect(gateway.ws_url, API_KEY)
        await holders[0].close()
        first = await waiters[0]
        queued = [event for event in waiter_sockets.sockets[0].received if event["type"] == "session.queued"]
        for session in [first, *holders[1:]]:
            await session.close()
        for session in await asyncio.gather(*waiters[1:]):
            await session.close()
        return refused.value, queued

    refused, queued = run(scenario())
    assert refused.code == "queue_full"
    assert queued[0]["position"] == 1 and queued[0]["estimated_wait_s"] > 0 and queued[0]["queue_length"] >= 1
    metrics = gateway.metrics()
    assert metrics.get("minicpmo_gateway_queue_length") == 0
    assert metrics.get('minicpmo_gateway_refusals_total{reason="queue_full"}', 0) >= 1


async def _until(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")
