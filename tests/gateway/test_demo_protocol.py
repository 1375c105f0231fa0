"""The official demo's protocol at /ws/duplex/{session_id}, spoken by a Python client as the
demo's documentation shows: queue_done -> prepare -> prepared -> audio_chunk each second ->
result per step; pause/resume; a video frame is refused while the session goes on; stop."""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect

from gateway_settings import API_KEY
from sdk_helpers import speech_then_silence

pytestmark = pytest.mark.server
CHUNK = 16000  # 1 s, the demo's chunk_ms


def _chunks(audio: np.ndarray) -> list[str]:
    return [base64.b64encode(audio[i:i + CHUNK].tobytes()).decode() for i in range(0, audio.size, CHUNK)]


async def _next(ws, kind: str, seen: list[dict]) -> dict:
    while True:
        message = json.loads(await ws.recv())
        seen.append(message)
        if message["type"] == kind:
            return message


async def _session(url: str) -> list[dict]:
    seen: list[dict] = []
    async with ws_connect(f"{url}/ws/duplex/adx_test1", subprotocols=["minicpmo.duplex", f"apikey.{API_KEY}"]) as ws:
        await _next(ws, "queue_done", seen)
        await ws.send(json.dumps({"type": "client_diagnostic", "data": {"audio_context": "running"}}))  # ignored
        await ws.send(json.dumps({"type": "prepare", "prefix_system_prompt": "You are a fun assistant.",
                                  "config": {"generate_audio": True, "chunk_ms": 1000, "temperature": 0.7,
                                             "force_listen_count": 1, "top_p": 0.8}}))
        await _next(ws, "prepared", seen)
        await ws.send(json.dumps({"type": "video_frame", "frame": "AAAA"}))
        await _next(ws, "error", seen)
        for index, chunk in enumerate(_chunks(speech_then_silence(9.0))):
            key = "audio" if index % 2 else "audio_base64"  # the documentation's name, the app's
            await ws.send(json.dumps({"type": "audio_chunk", key: chunk}))
            await asyncio.sleep(0.5)  # ahead of real time, within the gateway's bound
            if any(m["type"] == "result" and m["end_of_turn"] for m in seen):
                break
            await _drain(ws, seen)
        await _until_end_of_turn(ws, seen)
        await ws.send(json.dumps({"type": "pause"}))
        await _next(ws, "paused", seen)
        await ws.send(json.dumps({"type": "resume"}))
        await _next(ws, "resumed", seen)
        await ws.send(json.dumps({"type": "stop"}))
        await _next(ws, "stopped", seen)
    return seen


async def _drain(ws, seen: list[dict]) -> None:
    try:
        while True:
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), 0.01)))
    except asyncio.TimeoutError:
        return


async def _until_end_of_turn(ws, seen: list[dict]) -> None:
    while not any(m["type"] == "result" and m["end_of_turn"] for m in seen):
        seen.append(json.loads(await ws.recv()))


def test_demo_protocol_session(gateway):
    seen = asyncio.run(asyncio.wait_for(_session(gateway.ws_url), 120))
    results = [m for m in seen if m["type"] == "result"]
    listening = [m for m in results if m["is_listen"]]
    speaking = [m for m in results if not m["is_listen"]]
    assert listening and all(m["text"] == "" and m["audio_data"] == "" for m in listening)
    assert any(m["audio_data"] for m in speaking) and "".join(m["text"] for m in speaking)
    fields = {"is_listen", "text", "audio_data", "end_of_turn", "current_time", "cost_llm_ms", "cost_tts_ms",
              "cost_all_ms", "n_tokens", "n_tts_tokens", "server_send_ts"}
    assert all(fields <= set(m) for m in results)
    assert max(m["current_time"] for m in results) >= 1000
    prepared = next(m for m in seen if m["type"] == "prepared")
    assert prepared["config_not_applied"] == ["chunk_ms"]
    error = next(m for m in seen if m["type"] == "error")
    assert error["code"] == "video_not_supported" and "video_not_supported" in error["error"]
    assert seen[-1] == {**seen[-1], "type": "stopped", "session_id": "adx_test1", "reason": "client"}


def test_demo_queue_messages(gateway):
    from gateway_settings import CAPACITY
    from sdk_helpers import connect

    async def scenario():
        holders = [await connect(gateway.ws_url, API_KEY) for _ in range(CAPACITY)]
        protocols = ["minicpmo.duplex", f"apikey.{API_KEY}"]
        seen_first, seen_second = [], []
        first = await ws_connect(f"{gateway.ws_url}/ws/duplex/adx_q1", subprotocols=protocols)
        await _next(first, "queued", seen_first)
        async with ws_connect(f"{gateway.ws_url}/ws/duplex/adx_q2", subprotocols=protocols) as second:
            await _next(second, "queued", seen_second)
            await first.close()  # leaves the line: the second moves up
            update = await _next(second, "queue_update", seen_second)
            await holders[0].close()
            await _next(second, "queue_done", seen_second)
            await second.send(json.dumps({"type": "stop"}))
            await _next(second, "stopped", seen_second)
        for session in holders[1:]:
            await session.close()
        return seen_first[0], seen_second[0], update

    queued_first, queued_second, update = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert queued_first["position"] == 1 and queued_second["position"] == 2 and update["position"] == 1
    assert queued_second["eta_seconds"] > update["eta_seconds"] > 0 and queued_second["ticket_id"]
    assert update["estimated_wait_s"] == update["eta_seconds"]
