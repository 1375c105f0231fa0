"""One real tritonserver (cpu profile, tiny model, 3 sessions) and one gateway process in front
of it, shared by every gateway test of the run; SDK and raw WebSocket helpers."""
from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest

from backends.gateway.auth import key_line
from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess, free_port
from backends.serving.profiles import get_profile

API_KEY = "test-key-0123456789"
CAPACITY = 3
# Random weights never open a turn on their own: every session gets the reply-shape knobs.
SESSION_DEFAULTS = ["reply_units=2", "reply_tokens_per_unit=3"]
SERVER_OVERRIDES = {"max_sessions": str(CAPACITY), "idle_timeout_s": "20"}
EXIT_ARGS = ["--exit-timeout-secs=5"]  # as tests/server/server_args.py: a fast stop


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    options = ServerOptions(profile=get_profile("cpu").with_overrides(SERVER_OVERRIDES), workdir=PROJECT_ROOT / "var",
                            log_file=tmp_path_factory.mktemp("triton-gateway") / "server.log", extra_args=EXIT_ARGS)
    with ServerProcess(options) as proc:
        yield proc


class GatewayProcess:
    def __init__(self, triton_url: str, workdir, extra: list[str] = (), tls: ssl.SSLContext | None = None) -> None:
        self.port, self.tls = free_port(), tls
        keys = workdir / "keys"
        keys.write_text(f"# test keys\n{key_line(API_KEY)}\n")
        self.log = workdir / "gateway.log"
        command = [sys.executable, "-m", "backends.gateway.cli", "--triton", triton_url, "--port", str(self.port),
                   "--api-keys", str(keys), "--max-message-bytes", "262144", "--max-waiting", "4",
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


@pytest.fixture(scope="session")
def gateway(server, tmp_path_factory):
    proc = GatewayProcess(server.grpc_url, tmp_path_factory.mktemp("gateway"))
    yield proc
    proc.stop()
