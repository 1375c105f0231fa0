"""A `minicpmo-gateway` child process in front of a server, as the gateway tests start it (the
shared one, and ones of their own with other options)."""
from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request

from backends.gateway.auth import key_line
from backends.serving.server_process import PROJECT_ROOT, free_port
from gateway_settings import API_KEY, SESSION_DEFAULTS


class GatewayProcess:
    def __init__(self, triton_url: str, workdir, extra: list[str] = (), tls: ssl.SSLContext | None = None) -> None:
        self.port, self.tls = free_port(), tls
        keys = workdir / "keys"
        keys.write_text(f"# test keys\n{key_line(API_KEY)}\n")
        self.log = workdir / "gateway.log"
        command = [sys.executable, "-m", "backends.gateway.cli", "--triton", triton_url, "--port", str(self.port),
                   "--api-keys", str(keys), "--max-message-bytes", "262144", "--max-waiting", "4",
                   # every session of these tests moves its downlink several times (a second apart)
                   "--downlink-move-s", "1",
                   *[arg for item in SESSION_DEFAULTS for arg in ("--session-default", item)], *extra]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_ready()

    @property
    def http_url(self) -> str:
        return f"https://localhost:{self.port}" if self.tls else f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"wss://localhost:{self.port}" if self.tls else f"ws://127.0.0.1:{self.port}"

    def metrics(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"{self.http_url}/metrics", timeout=5, context=self.tls).read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log.read_text()[-3000:]}")
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(self.log.read_text()[-3000:])

    def stop(self, timeout_s: float = 40.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
