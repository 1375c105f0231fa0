"""The WebSocket gateway as a child of the launcher (`minicpmo-server --gateway-port 8080`):
started once the server is ready, stopped (SIGTERM: every session closed with a reason) before
the server stops. It runs `minicpmo-gateway` (backends/gateway) as its own process: the gateway
is the layer above this one, and a process of its own keeps its event loop off the launcher's."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

STOP_TIMEOUT_S = 40.0  # the gateway's drain timeout (30 s) and its exit


@dataclass
class GatewayOptions:
    port: int
    api_keys: Path | None = None
    extra_args: list[str] = field(default_factory=list)


class GatewayChild:
    def __init__(self, options: GatewayOptions, address: str, grpc_url: str, log_file: Path) -> None:
        self.options, self.address, self.grpc_url, self.log_file = options, address, grpc_url, log_file
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        opts = self.options
        keys = ["--api-keys", str(opts.api_keys)] if opts.api_keys else []
        return [sys.executable, "-m", "backends.gateway.cli", "--triton", self.grpc_url, "--host", self.address,
                "--port", str(opts.port), *keys, *opts.extra_args]

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> int | None:
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode
