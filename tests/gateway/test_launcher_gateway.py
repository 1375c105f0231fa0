"""The launcher's gateway child (`minicpmo-server --gateway-port`): its command line, and a
real start in front of the test server that answers and stops cleanly."""
from __future__ import annotations

import time
import urllib.request

import pytest

from backends.serving.gateway_process import GatewayChild, GatewayOptions
from backends.serving.server_process import free_port
from backends.serving.launcher import parse_args


def test_gateway_options_of_the_launcher(tmp_path):
    args = parse_args(["--gateway-port", "8080", "--gateway-api-keys", str(tmp_path / "keys")])
    assert args.gateway_port == 8080 and args.gateway_api_keys == tmp_path / "keys"
    assert parse_args([]).gateway_port == 0  # no gateway unless asked
    child = GatewayChild(GatewayOptions(8080, tmp_path / "keys"), "0.0.0.0", "127.0.0.1:8001", tmp_path / "g.log")
    command = child.command()
    assert command[1:3] == ["-m", "backends.gateway.cli"]
    assert command[command.index("--triton") + 1] == "127.0.0.1:8001" and "--api-keys" in command


@pytest.mark.server
def test_gateway_child_serves_and_stops(server, tmp_path):
    port = free_port()
    child = GatewayChild(GatewayOptions(port), "127.0.0.1", server.grpc_url, tmp_path / "gateway.log")
    child.start()
    try:
        text = _wait_metrics(f"http://127.0.0.1:{port}/metrics")
        assert "minicpmo_gateway_queue_capacity 3" in text
    finally:
        assert child.stop() == 0


def _wait_metrics(url: str) -> str:
    for _ in range(200):
        try:
            return urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)
