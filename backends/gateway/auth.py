"""API keys: the gateway stores only SHA-256 digests of the keys and compares digests in
constant time, before any queueing or model work.

Keys come from a file (one `sha256:<hex>` line per key; blank lines and `#` comments ignored;
`minicpmo-gateway --hash-key` prints the line for a key read from stdin) and/or the environment
variable MINICPMO_GATEWAY_API_KEYS (comma-separated keys, hashed as they are read). With neither,
the gateway accepts every connection.

A client presents its key as `Authorization: Bearer <key>` (the SDK) or, since browsers cannot
set headers on a WebSocket, as a second subprotocol entry `apikey.<key>` beside the protocol's
own one; the gateway never echoes that entry back.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_KEYS = "MINICPMO_GATEWAY_API_KEYS"
PREFIX = "sha256:"
SUBPROTOCOL_PREFIX = "apikey."


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_line(key: str) -> str:
    return PREFIX + digest(key).hex()


@dataclass(frozen=True)
class ApiKeys:
    digests: tuple[bytes, ...]

    @property
    def required(self) -> bool:
        return bool(self.digests)

    @staticmethod
    def load(path: Path | None, environ: Mapping[str, str] = os.environ) -> "ApiKeys":
        digests = [digest(key.strip()) for key in environ.get(ENV_KEYS, "").split(",") if key.strip()]
        if path is not None:
            digests += [_parse_line(line, path) for line in path.read_text().splitlines()
                        if line.strip() and not line.lstrip().startswith("#")]
        return ApiKeys(tuple(digests))

    def accepts(self, key: str | None) -> bool:
        """Constant time in the key; every stored digest is compared."""
        if not self.required:
            return True
        offered = digest(key or "")
        found = False
        for stored in self.digests:
            found |= hmac.compare_digest(stored, offered)
        return found and key is not None


def presented_key(headers: Mapping[str, str], subprotocols: Iterable[str]) -> str | None:
    """The key of the request: the Bearer token, else an `apikey.` subprotocol entry."""
    authorization = headers.get("Authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    for entry in subprotocols:
        if entry.startswith(SUBPROTOCOL_PREFIX):
            return entry[len(SUBPROTOCOL_PREFIX):]
    return None


def _parse_line(line: str, path: Path) -> bytes:
    text = line.strip()
    hex_digest = text[len(PREFIX):] if text.startswith(PREFIX) else ""
    try:
        value = bytes.fromhex(hex_digest)
    except ValueError:
        value = b""
    if len(value) != 32:
        raise ValueError(f"{path}: a line is not `{PREFIX}<64 hex digits>`")
    return value
