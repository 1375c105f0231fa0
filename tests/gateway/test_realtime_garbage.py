"""Bad client messages on /v1/realtime are answered with error events (the Realtime protocol's
errors end their session) while another session of the same gateway goes on."""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from openbmb_realtime import TextDelta
from websockets.asyncio.client import connect as ws_connect

from gateway_settings import API_KEY
from sdk_helpers import collect, connect, send_paced, speech_then_silence

pytestmark = pytest.mark.server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SILENCE = base64.b64encode(np.zeros(1600, np.float32).tobytes()).decode()
ONE_SECOND = json.dumps({"type": "input.append", "input": {"audio": base64.b64encode(np.zeros(16000, np.float32)
                                                                                      .tobytes()).decode()}})


async def _answer_to(url: str, messages: list[str | bytes], init: bool) -> dict:
    """Open a raw session, optionally init it, send `messages`, return the first error event."""
    async with ws_connect(f"{url}/v1/realtime?mode=audio&model=m", additional_headers=HEADERS,
                          subprotocols=["map.realtime"], max_size=None) as ws:
        await _until(ws, "session.queue_done")
        if init:
            await ws.send(json.dumps({"type": "session.init", "payload": {}}))
            await _until(ws, "session.created")
        for message in messages:
            await ws.send(message)
        error = await _until(ws, "error")
        closed = await _until(ws, "session.closed")
        assert closed["reason"] == "error"
        return error


async def _until(ws, kind: str) -> dict:
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == kind:
            return event


GARBAGE = {
    "bad_json": (["{not json"], False, "invalid_json"),
    "unknown_type": ([json.dumps({"type": "nonsense"})], True, "unknown_event_type"),
    "append_before_init": ([json.dumps({"type": "input.append", "input": {"audio": SILENCE}})], False,
                           "session_not_initialized"),
    "invalid_base64": ([json.dumps({"type": "input.append", "input": {"audio": "@@@not base64"}})], True,
                       "invalid_audio"),
    "oversize": ([json.dumps({"type": "input.append", "input": {"audio": "A" * 300_000}})], True,
                 "message_too_large"),
    "too_fast": ([ONE_SECOND] * 6, True, "input_rate_exceeded"),  # 6 s at once: past the 4 s of slack
    "video_frames": ([json.dumps({"type": "input.append", "input": {"audio": SILENCE, "video_frames": ["AAAA"]}})],
                     True, "video_not_supported"),
}


def test_an_empty_mode_is_audio(gateway):
    async def scenario():
        async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=&model=m", additional_headers=HEADERS,
                              subprotocols=["map.realtime"]) as ws:
            return await asyncio.wait_for(_until(ws, "session.queue_done"), 30)

    assert asyncio.run(scenario())["type"] == "session.queue_done"


def test_the_gateway_declines_per_message_deflate(gateway):
    """Reply audio barely compresses and deflating it costs the gateway milliseconds a message."""
    async def scenario():
        async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=audio&model=m", additional_headers=HEADERS,
                              subprotocols=["map.realtime"], compression="deflate") as ws:
            await asyncio.wait_for(_until(ws, "session.queue_done"), 30)
            return ws.response.headers.get("Sec-WebSocket-Extensions")

    assert asyncio.run(scenario()) is None


def test_garbage_is_answered_while_another_session_goes_on(gateway):
    async def scenario():
        healthy = await connect(gateway.ws_url, API_KEY)
        sender = asyncio.ensure_future(send_paced(healthy, speech_then_silence(8.0)))
        errors = {}
        for name, (messages, init, _) in GARBAGE.items():
            errors[name] = await _answer_to(gateway.ws_url, messages, init)
        got = await collect(healthy)
        sender.cancel()
        await healthy.close()
        return errors, got

    errors, got = asyncio.run(asyncio.wait_for(scenario(), 120))
    for name, (_, _, code) in GARBAGE.items():
        assert errors[name]["error"]["code"] == code, (name, errors[name])
        assert errors[name]["error"]["message"]
    assert got.of(TextDelta), "the healthy session got its reply"
    metrics = gateway.metrics()
    for _, _, code in GARBAGE.values():
        assert metrics[f'minicpmo_gateway_errors_total{{code="{code}"}}'] >= 1
    assert metrics['minicpmo_gateway_frames_total{direction="in"}'] > 0
    assert metrics['minicpmo_gateway_bytes_total{direction="out"}'] > 0
