"""One address form for the client, the readiness probe and the benchmark (client/url.py)."""
from __future__ import annotations

import pytest

from client.url import grpc_target, grpc_targets, http_url, parse_address


@pytest.mark.parametrize("text, target", [
    ("127.0.0.1:8001", "127.0.0.1:8001"),
    ("http://127.0.0.1:8001", "127.0.0.1:8001"),
    ("http://replica-a:9001/", "replica-a:9001"),
    ("  localhost:8001 ", "localhost:8001"),
    ("[::1]:8001", "[::1]:8001"),
    ("http://[::1]:8001", "[::1]:8001"),
])
def test_grpc_target_from_either_form(text, target):
    assert grpc_target(text) == target


@pytest.mark.parametrize("text, url", [
    ("127.0.0.1:8002", "http://127.0.0.1:8002/metrics"),
    ("http://127.0.0.1:8002", "http://127.0.0.1:8002/metrics"),
    ("https://metrics.example:443/custom", "https://metrics.example:443/custom"),
    ("[::1]:8002/metrics", "http://[::1]:8002/metrics"),
])
def test_http_url_from_either_form(text, url):
    assert http_url(text, default_path="/metrics") == url


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("127.0.0.1", "no port"),
    ("127.0.0.1:http", "bad port"),
    ("127.0.0.1:70000", "bad port"),
    ("grpc://127.0.0.1:8001", "scheme"),
    ("http://:8001", "no host"),
    ("http://127.0.0.1:8001/v2", "no path"),
    ("http://user:pw@127.0.0.1:8001", "credentials"),
    ("https://127.0.0.1:8001", "without TLS"),
])
def test_malformed_addresses_say_what_is_expected(text, why):
    with pytest.raises(ValueError, match=why) as info:
        grpc_target(text)
    assert "host:port" in str(info.value)


def test_a_default_port_fills_a_missing_one():
    assert parse_address("http://replica-a", default_port=8000).http == "http://replica-a:8000"


def test_replica_lists_take_either_form():
    assert grpc_targets("a:1, http://b:2,") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="host:port"):
        grpc_targets(" , ")
