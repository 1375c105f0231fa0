"""Readiness of the server: every model loaded, and every model able to serve.

Triton 2.51 reports a model READY as long as it is loaded: a model whose stub process was
killed, or a stage whose engine thread died, still shows READY on /v2/health/ready and
/v2/models/<model>/ready while every request to it fails (verified: a killed stub answers
"Stub process ... is not healthy" forever, 2.51 does not restart it, and it has no model
`is_ready` hook). So the probe asks each model itself, over gRPC, the way it is really called,
all four at once (a model that does not answer costs the probe one timeout, not one each):

- each model must be loaded (Triton's `v2/models/<model>/ready`, HTTP);
- `duplex` gets one stream request with sequence START and END and the health mark
  (backends/serving/duplex_health.py), the path a client's session takes, and must answer it
  with an empty FINAL; one whose stub process is gone fails the request;
- each stage gets a request with ACTION `health` (backends/serving/stage_health.py) over the
  path `duplex` calls it by (backends/serving/stage_channel.py) and must answer it with an
  empty FINAL; a stage whose engine thread is gone answers UNAVAILABLE, and one whose stub
  process is gone fails the request itself. `health` is the one action a stage serves without
  the server's stage secret (backends/serving/stage_secret.py): it holds nothing, so the probe
  needs no secret and runs from anywhere that reaches the ports.

    python -m backends.serving.health --url HOST:8000 [--grpc-url HOST:8001]

prints the report and exits 0 (ready) or 1 (not ready). Both addresses take `host:port` or
`http://host:port` (client/url.py); the gRPC address defaults to port 8001 of the `--url` host.
`--endpoints WORKDIR/endpoints.json` takes both from the file a launcher writes there instead
(backends/serving/endpoints.py): the container's health check, whatever ports it serves.
The launcher's readiness (`ServerProcess.is_ready`) is the same probe.
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from client.url import grpc_target, parse_address

from backends.contracts.stage_clients import STAGES, StageCallError
from backends.serving.duplex_health import DUPLEX_MODEL, ask_duplex
from backends.serving.endpoints import Endpoints
from backends.serving.stage_channel import StageChannel
from backends.serving.stage_health import health_request
from backends.contracts.tensor_codec import to_arrays

MODELS = (DUPLEX_MODEL, *STAGES)
OK = "ok"
DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT = 8000, 8001  # Triton's and the launcher's
# A health answer comes at once; a stream still open this long after it is cancelled.
STAGE_CLOSE_WAIT_S = 1.0
# What asking an HTTP endpoint that is not (or not yet) a Triton server raises.
UNREACHABLE = (OSError, ValueError, http.client.HTTPException)


@dataclass(frozen=True, slots=True)
class HealthReport:
    models: dict[str, str]  # model -> "ok" or why it cannot serve

    @property
    def ready(self) -> bool:
        return bool(self.models) and all(state == OK for state in self.models.values())

    @property
    def down(self) -> list[str]:
        return sorted(model for model, state in self.models.items() if state != OK)

    def to_json(self) -> str:
        return json.dumps({"ready": self.ready, "models": self.models}, sort_keys=True)


def default_grpc_url(http_url: str) -> str:
    """The gRPC address of the server at `http_url`: its host, Triton's default gRPC port."""
    return parse_address(http_url, default_port=DEFAULT_GRPC_PORT, allow_path=True).with_port(DEFAULT_GRPC_PORT).grpc


def model_loaded(http_url: str, model: str, timeout_s: float) -> str:
    """OK when Triton reports `model` ready (loaded); raises one of UNREACHABLE when nothing answers."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/ready", timeout=timeout_s) as resp:
            return OK if resp.status == 200 else f"not loaded (HTTP {resp.status})"
    except urllib.error.HTTPError as exc:
        return f"not loaded (HTTP {exc.code})"


def stage_serves(grpc_url: str, stage: str, timeout_s: float,
                 channel_factory: Callable[[str, float], StageChannel] = StageChannel) -> str:
    """OK when `stage` answers its health request; else its error (or the channel's)."""
    channel = None
    try:
        channel = channel_factory(grpc_url, timeout_s)
        for _ in channel.call(stage, to_arrays(health_request(stage))):
            pass
        return OK
    except StageCallError as exc:
        return f"[{exc.error.code}] {exc.error.message}"
    except Exception as exc:  # the client refused the address or the request
        return f"{type(exc).__name__}: {exc}"
    finally:
        if channel is not None:
            channel.close(STAGE_CLOSE_WAIT_S)


def duplex_serves(grpc_url: str, timeout_s: float) -> str:
    """OK when `duplex` answers its health probe; else why not."""
    problem = ask_duplex(grpc_url, timeout_s)
    return OK if problem is None else problem


def model_state(http_url: str, grpc_url: str, model: str, timeout_s: float,
                channel_factory: Callable[[str, float], StageChannel]) -> str:
    """OK when `model` is loaded and answers its health request; raises one of UNREACHABLE
    when the HTTP endpoint does not answer."""
    loaded = model_loaded(http_url, model, timeout_s)
    if loaded != OK:
        return loaded
    if model == DUPLEX_MODEL:
        return duplex_serves(grpc_url, timeout_s)
    return stage_serves(grpc_url, model, timeout_s, channel_factory)


def probe(http_url: str, grpc_url: str | None = None, timeout_s: float = 10.0,
          channel_factory: Callable[[str, float], StageChannel] | None = None) -> HealthReport:
    """Every model's state, the models asked together: the probe takes at most about two
    `timeout_s` (HTTP, then gRPC). Raises one of UNREACHABLE when the server's HTTP endpoint
    does not answer. `channel_factory` (tests) defaults to StageChannel."""
    url, factory = grpc_url or default_grpc_url(http_url), channel_factory or StageChannel
    with ThreadPoolExecutor(len(MODELS), thread_name_prefix="model-health") as pool:
        states = pool.map(lambda model: model_state(http_url, url, model, timeout_s, factory), MODELS)
        return HealthReport(dict(zip(MODELS, states)))


def server_ready(http_url: str, grpc_url: str | None = None, check_stages: bool = True,
                 timeout_s: float = 10.0) -> bool:
    """Triton's own readiness (every model loaded) and, with `check_stages`, the probe's: every
    model, `duplex` and the stages, answering its health request."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=timeout_s) as resp:
            if resp.status != 200:
                return False
        return probe(http_url, grpc_url, timeout_s).ready if check_stages else True
    except UNREACHABLE:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Exit 0 when every model of the server can serve, else 1.")
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address: host:port or http(s)://host:port")
    parser.add_argument("--grpc-url", default=None,
                        help=f"Triton gRPC address: host:port or http://host:port "
                             f"(default: the --url host, port {DEFAULT_GRPC_PORT})")
    parser.add_argument("--endpoints", type=Path, default=None, metavar="FILE",
                        help="read both addresses from the endpoints.json a launcher writes in its workdir "
                             "(the container's health check: whatever ports the server was given)")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.endpoints is not None:
        try:
            served = Endpoints.read(args.endpoints)
        except ValueError as exc:  # no server ready yet: not ready, not a usage error
            print(json.dumps({"ready": False, "error": str(exc)}))
            return 1
        args.url, args.grpc_url = served.http, served.grpc
    try:
        http = parse_address(args.url, default_port=DEFAULT_HTTP_PORT).http
        grpc = grpc_target(args.grpc_url) if args.grpc_url else None
    except ValueError as exc:  # a malformed address: a usage error
        parser.error(str(exc))
    try:
        report = probe(http, grpc, args.timeout)
    except UNREACHABLE as exc:
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(report.to_json())
    return 0 if report.ready else 1


if __name__ == "__main__":
    sys.exit(main())
