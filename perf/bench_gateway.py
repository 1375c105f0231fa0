"""The WebSocket gateway of `duplex_bench --via gateway`: started in front of the benchmarked
server for the run, and the per-level comparison of TTFP through it against direct gRPC."""
from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from backends.serving.gateway_process import GatewayChild, GatewayOptions
from backends.serving.server_process import free_port
from perf.duplex_levels import LevelResult

READY_TIMEOUT_S = 60.0


@contextlib.contextmanager
def gateway_in_front(grpc_url: str, log_dir: Path) -> Iterator[str]:
    """A gateway on a free loopback port for `grpc_url`; yields its ws:// base URL."""
    port = free_port()
    child = GatewayChild(GatewayOptions(port, extra_args=["--max-waiting", "1024"]), "127.0.0.1", grpc_url,
                         log_dir / f"gateway-{port}.log")
    child.start()
    try:
        _wait_ready(f"http://127.0.0.1:{port}/metrics")
        print(f"gateway ready: ws://127.0.0.1:{port} (log {child.log_file})", flush=True)
        yield f"ws://127.0.0.1:{port}"
    finally:
        child.stop()


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=2).read()
            return
        time.sleep(0.2)
    raise TimeoutError(f"the gateway did not answer {url}")


def added_ttfp_lines(direct: list[LevelResult], gateway: list[LevelResult]) -> list[str]:
    """Per level: client TTFP (mean, p99) direct and via the gateway, and the transport's share:
    client TTFP minus the server's own TTFP, which takes the server's variance between the two
    runs out of the comparison."""
    lines = []
    for ours, theirs in zip(direct, gateway):
        a, b = ours.summary.metrics["client_ttfp_ms"], theirs.summary.metrics["client_ttfp_ms"]
        wire_a, wire_b = _wire(ours), _wire(theirs)
        added = wire_b - wire_a if wire_a is not None and wire_b is not None else None
        lines.append(f"C={ours.summary.concurrency}: client TTFP mean {_ms(a.mean)} direct, {_ms(b.mean)} via gateway; "
                     f"p99 {_ms(a.p99)} / {_ms(b.p99)}; client minus server TTFP {_ms(wire_a)} / {_ms(wire_b)}: "
                     f"the gateway added {_ms(added)}")
    return lines


def _wire(result: LevelResult) -> float | None:
    client, server = result.summary.metrics["client_ttfp_ms"].mean, result.summary.metrics["server_ttfp_ms"].mean
    return client - server if client is not None and server is not None else None


def print_added_ttfp(direct: list[LevelResult], gateway: list[LevelResult]) -> None:
    for line in added_ttfp_lines(direct, gateway):
        print(line, flush=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
