"""The stage secret: stage models (thinker, talker, code2wav) serve the server's own orchestrator only.

The stages share the server's public gRPC port with `duplex`, and their requests carry engine
state by request id (a Thinker setup holds a slot and KV until its `stop`; a `stop` ends
whatever request has that id). So every stage request must carry the secret the launcher
generated for this server start, as the request parameter `SECRET_PARAMETER`; a stage refuses
any other with `[forbidden]` before its engine sees it (backends/serving/triton_stage.py).

The launcher writes the secret to a file only its user can read (0600) and hands the path to
the model processes in `SECRET_FILE_ENV`; `duplex` reads it there and sends it on every stage
request. A `health` request needs no secret: it reads whether the engine thread runs and holds
nothing, so the readiness probe works from anywhere. A server started without the variable
(plain `tritonserver` on the repository) runs its stages unguarded and says so in its log
(deploy/README.md "Ports and the stage secret").
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SECRET_FILE_ENV = "MINICPMO_STAGE_SECRET_FILE"  # path of the file holding this server's secret
SECRET_PARAMETER = "minicpmo_stage_secret"  # the request parameter that carries it
SECRET_BYTES = 32


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def write_secret_file(path: Path, secret: str) -> Path:
    """Write `secret` to `path` readable by its owner only (0600, also when it existed)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new folder: its owner's only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(secret + "\n")
    return path


def read_secret_file(path: Path) -> str:
    """The secret in `path`; ValueError when the file cannot be read or holds nothing."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{SECRET_FILE_ENV}: cannot read the stage secret file {str(path)!r}: {exc}") from exc
    if not secret:
        raise ValueError(f"{SECRET_FILE_ENV}: the stage secret file {str(path)!r} is empty")
    return secret


def configured_secret(environ: Mapping[str, str] = os.environ) -> str | None:
    """This server's secret, None when SECRET_FILE_ENV is unset or empty (stages unguarded).
    A variable that names an unreadable or empty file raises ValueError: a model that was
    meant to be guarded must not load unguarded."""
    path = environ.get(SECRET_FILE_ENV, "")
    return read_secret_file(Path(path)) if path else None


def secret_parameters(secret: str | None) -> dict[str, str]:
    """The request parameters that carry `secret` (none without one)."""
    return {SECRET_PARAMETER: secret} if secret else {}


@dataclass(frozen=True, slots=True)
class StageGuard:
    """The check a stage makes on every request but `health`."""

    secret: str | None  # None: no secret configured, every request is served

    @staticmethod
    def from_environment(environ: Mapping[str, str] = os.environ) -> "StageGuard":
        return StageGuard(configured_secret(environ))

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def allows(self, parameters: str) -> bool:
        """Whether a request with these parameters (Triton's JSON object) carries the secret;
        compared in constant time, so the answer's timing tells nothing about the secret."""
        if self.secret is None:
            return True
        try:
            given = json.loads(parameters or "{}").get(SECRET_PARAMETER)
        except (ValueError, AttributeError):
            return False
        if not isinstance(given, str):
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.secret.encode("utf-8"))
