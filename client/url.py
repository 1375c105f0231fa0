"""One form for server addresses everywhere: `host:port` or `http(s)://host:port`.

The client, the readiness probe and the benchmark all take the address a Triton user types;
each asks for the form its transport needs (gRPC's `host:port`, or an HTTP URL). An IPv6 host
is written in brackets (`[::1]:8001`). Anything else is refused with a message saying what
was expected.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

SCHEMES = ("http", "https")
EXPECTED = "expected host:port or http(s)://host:port"


@dataclass(frozen=True, slots=True)
class ServerAddress:
    host: str
    port: int
    scheme: str = "http"  # of the HTTP form; gRPC carries no scheme
    path: str = ""  # an HTTP URL's path (the metrics page), else empty

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def grpc(self) -> str:
        """`host:port`, what tritonclient's gRPC client takes."""
        if self.scheme == "https":
            raise ValueError(f"{self.scheme}://{self.netloc}: the gRPC client connects without TLS; "
                             f"give host:port or http://host:port")
        return self.netloc

    @property
    def http(self) -> str:
        """`scheme://host:port[path]`, what an HTTP request takes."""
        return f"{self.scheme}://{self.netloc}{self.path}"

    def with_port(self, port: int) -> "ServerAddress":
        return ServerAddress(self.host, port, self.scheme, self.path)


def parse_address(text: str, *, default_port: int | None = None, allow_path: bool = False) -> ServerAddress:
    """`text` as a server address; ValueError names what is wrong. A missing port takes
    `default_port` when one is given; a path is kept only where `allow_path` (a metrics URL)."""
    raw = text.strip()
    if not raw:
        raise ValueError(f"empty server address: {EXPECTED}")
    has_scheme = "://" in raw
    parts = urllib.parse.urlsplit(raw if has_scheme else f"http://{raw}")
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{text!r}: scheme {parts.scheme!r} is not http or https; {EXPECTED}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{text!r}: {EXPECTED} (no query, fragment or credentials)")
    path = parts.path.rstrip("/")
    if path and not allow_path:
        raise ValueError(f"{text!r}: {EXPECTED} (no path)")
    host = parts.hostname
    if not host:
        raise ValueError(f"{text!r}: no host; {EXPECTED}")
    try:
        port = parts.port
    except ValueError as exc:  # not a number, or out of range
        raise ValueError(f"{text!r}: bad port ({exc}); {EXPECTED}") from None
    if port is None:
        if default_port is None:
            raise ValueError(f"{text!r}: no port; {EXPECTED}")
        port = default_port
    return ServerAddress(host, port, parts.scheme, path)


def grpc_target(text: str) -> str:
    """`host:port` for tritonclient's gRPC client from either form."""
    return parse_address(text).grpc


def http_url(text: str, *, default_path: str = "") -> str:
    """An HTTP URL from either form; `default_path` (e.g. `/metrics`) where `text` has none."""
    address = parse_address(text, allow_path=True)
    return address.http if address.path else address.http + default_path


def grpc_targets(text: str) -> list[str]:
    """A comma-separated list of addresses (replicas), each as `host:port`."""
    targets = [grpc_target(item) for item in text.split(",") if item.strip()]
    if not targets:
        raise ValueError(f"no server address in {text!r}: {EXPECTED}")
    return targets
