"""The browser page at / in a real headless Chromium with a fake microphone playing the
repository's utterance (then silence) against the real server: the page receives reply audio
and schedules it for playback, shows the reply text, and the listen/speak state."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect

from browser import CHROMIUM, Browser, wait_for
from client.wav import write_wav
from gateway_settings import API_KEY
from sdk_helpers import speech_then_silence

pytestmark = [pytest.mark.server, pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian package chromium")]
# Set to a path to keep the screenshot (the README's is made this way).
SCREENSHOT_ENV = "MINICPMO_PAGE_SCREENSHOT"


def test_page_plays_reply_audio_and_shows_text(gateway, tmp_path):
    microphone = tmp_path / "microphone.wav"
    write_wav(microphone, (speech_then_silence(5.0) * 32767).astype(np.int16), 16000)
    browser = Browser(f"{gateway.http_url}/", microphone, tmp_path / "profile")
    try:
        state = asyncio.run(asyncio.wait_for(_drive(browser, tmp_path / "page.png"), 90))
    finally:
        browser.close()
    assert state["chunks"] >= 1 and state["scheduledS"] > 0.5, state
    assert state["text"].strip() and state["shown"].strip() == state["text"].strip()
    assert state["state"] in ("listening", "speaking") and not state["errors"]


async def _drive(browser: Browser, screenshot: Path) -> dict:
    async with ws_connect(await asyncio.to_thread(browser.page_socket_url), max_size=None) as ws:
        await wait_for(browser, ws, "document.readyState === 'complete' && !!document.getElementById('start')", 20)
        await browser.evaluate(ws, f"document.getElementById('key').value = {json.dumps(API_KEY)};"
                                   "document.getElementById('start').click(); true")
        await wait_for(browser, ws, "window.gw.chunks > 0 && window.gw.text.trim().length > 0", 60)
        state = json.loads(await browser.evaluate(
            ws, "JSON.stringify({...window.gw, shown: document.getElementById('text').textContent})"))
        await browser.screenshot(ws, Path(os.environ.get(SCREENSHOT_ENV) or screenshot))
        return state
