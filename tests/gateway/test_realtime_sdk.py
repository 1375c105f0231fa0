"""The MiniCPM-o Realtime V1 protocol at /v1/realtime, driven by the real openbmb-realtime SDK
against the real server (tiny model) through one shared gateway."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from openbmb_realtime import AudioDelta, RealtimeConfig, RealtimeError, SessionReady, TextDelta
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from gateway_settings import API_KEY
from sdk_helpers import client, collect, connect, send_paced, speech_then_silence

pytestmark = pytest.mark.server


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def _one_reply(url: str):
    session = await connect(url, API_KEY)
    sender = asyncio.ensure_future(send_paced(session, speech_then_silence(8.0)))
    got = await collect(session)
    sender.cancel()
    await session.close()
    await session.close()  # a second close is a no-op
    return session, got


def test_audio_session_has_replies_and_usage(gateway):
    session, got = run(_one_reply(gateway.ws_url))
    audio = b"".join(event.audio for event in got.of(AudioDelta))
    assert got.of(SessionReady) and session.id.startswith("gw-")
    assert got.of(TextDelta) and any(event.end_of_turn for event in got.of(TextDelta))
    samples = np.frombuffer(audio, "<f4")
    assert samples.size >= 24000 // 2 and np.isfinite(samples).all() and np.abs(samples).max() <= 1.0
    usage = session.usage
    assert usage is not None and usage.audio_input_tokens >= 10 and usage.audio_output_tokens >= 12
    assert usage.completion_tokens > usage.audio_output_tokens, "no text tokens counted"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert session.state.value == "closed"


def test_a_text_only_session_has_text_replies_and_no_audio(gateway):
    """config.tts_enabled false: text deltas and the end of turn, no audio (max_kv_tokens set
    as well, within the server's context)."""
    async def text_only():
        config = RealtimeConfig(temperature=0.7, tts_enabled=False, max_kv_tokens=2048)
        session = await client(gateway.ws_url, API_KEY).audio.connect(model="minicpm-o-4.5", config=config)
        sender = asyncio.ensure_future(send_paced(session, speech_then_silence(8.0)))
        got = await collect(session)
        sender.cancel()
        await session.close()
        return session, got

    session, got = run(text_only())
    assert got.of(SessionReady)
    assert any(event.text for event in got.of(TextDelta)) and any(event.end_of_turn for event in got.of(TextDelta))
    assert not got.of(AudioDelta)
    assert session.usage is not None and not session.usage.audio_output_tokens


def test_wrong_key_is_refused_before_any_session(gateway):
    async def attempt():
        started = time.monotonic()
        with pytest.raises(RealtimeError) as err:
            await connect(gateway.ws_url, "not-the-key")
        return time.monotonic() - started, err.value

    elapsed, error = run(attempt())
    assert elapsed < 1.0 and error.code == "socket_create_failed"
    assert "401" in str(error.cause)


def test_video_mode_is_refused_with_its_code(gateway):
    from sdk_helpers import client

    async def attempt():
        with pytest.raises(RealtimeError) as err:
            await client(gateway.ws_url, API_KEY).video.connect(model="minicpm-o-4.5")
        return err.value

    assert run(attempt()).code == "video_not_supported"


def test_foreign_browser_origin_is_refused(gateway):
    async def attempt(origin: str):
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=audio&model=m", origin=origin,
                                  subprotocols=["map.realtime", f"apikey.{API_KEY}"]):
                pass
        return refused.value.response.status_code

    assert run(attempt("http://elsewhere.example")) == 403


def test_browser_key_as_subprotocol_entry(gateway):
    async def attempt():
        async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=audio&model=m",
                              subprotocols=["map.realtime", f"apikey.{API_KEY}"]) as ws:
            return ws.subprotocol, json.loads(await ws.recv())["type"]

    assert run(attempt()) == ("map.realtime", "session.queue_done")
