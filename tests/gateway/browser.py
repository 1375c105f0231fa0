"""Headless Chromium (the Debian package) with a fake microphone fed from a wav file, driven
over the DevTools protocol: open a page, run JavaScript in it, take a screenshot."""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from backends.serving.server_process import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, url: str, microphone_wav: Path, profile_dir: Path) -> None:
        self.port, self.url = free_port(), url
        self.process = subprocess.Popen([
            CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone_wav}", "--autoplay-policy=no-user-gesture-required",
            f"--remote-debugging-port={self.port}", f"--user-data-dir={profile_dir}", "--window-size=900,760", url,
        ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._ids = 0

    def page_socket_url(self, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2))
                pages = [t for t in targets if t.get("type") == "page" and t.get("url", "").startswith(self.url)]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("chromium did not open its page")

    async def call(self, ws, method: str, **params) -> dict:
        self._ids += 1
        await ws.send(json.dumps({"id": self._ids, "method": method, "params": params}))
        while True:
            answer = json.loads(await ws.recv())
            if answer.get("id") == self._ids:
                return answer.get("result", {})

    async def evaluate(self, ws, expression: str):
        result = await self.call(ws, "Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def screenshot(self, ws, path: Path) -> None:
        shot = await self.call(ws, "Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def wait_for(browser: Browser, ws, expression: str, timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await browser.evaluate(ws, expression)
        if value:
            return value
        await asyncio.sleep(0.25)
    raise TimeoutError(expression)


