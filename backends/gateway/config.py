"""The gateway's settings and its command line:

    minicpmo-gateway --triton HOST:PORT --port 8080 [--api-keys FILE] [--certfile F --keyfile F]

Session capacity is not a setting: it is read from the server (capacity.py)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# How often a session's downlink moves to a fresh request: the server keeps per open request what
# it answered on it until its FINAL (docs/triton_behaviours.md), ~4 MiB a minute of audio.
DOWNLINK_MOVE_S = 120.0

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # 30 s of float32 reference voice in base64 is 2.6 MB


@dataclass(frozen=True)
class GatewayConfig:
    triton_url: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys_file: Path | None = None
    allowed_origins: tuple[str, ...] = ()  # besides the gateway's own origin; "*": any
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_waiting: int = 64  # the admission queue's bound
    rate_slack_s: float = 4.0  # input may run this far ahead of real time (the server allows 5 s)
    init_timeout_s: float = 30.0  # queue_done -> the client's init message
    drain_timeout_s: float = 30.0  # END -> the server's session.closed, then the stream is cancelled
    pause_timeout_s: float = 60.0
    downlink_move_s: float = DOWNLINK_MOVE_S  # each session's downlink moves to a fresh request this often
    certfile: Path | None = None
    keyfile: Path | None = None
    # START parameters every session gets unless its client sets them (e.g. the reply-shape knobs
    # that tests and benchmarks need with random weights: docs/duplex_contract.md).
    session_defaults: dict[str, Any] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="minicpmo-gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triton", default="127.0.0.1:8001", help="gRPC address of the server (HOST:PORT)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-keys", type=Path, help="file of `sha256:<hex>` key digests (--hash-key)")
    parser.add_argument("--allowed-origin", action="append", default=[],
                        help="a browser origin allowed besides the gateway's own (repeat; '*' for any)")
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    parser.add_argument("--max-waiting", type=int, default=64, help="bound of the admission queue")
    parser.add_argument("--rate-slack-s", type=float, default=4.0,
                        help="how far input audio may run ahead of real time")
    parser.add_argument("--init-timeout-s", type=float, default=30.0,
                        help="how long an admitted connection may take to send its session init")
    parser.add_argument("--pause-timeout-s", type=float, default=60.0,
                        help="how long a paused session of the demo protocol stays open")
    parser.add_argument("--downlink-move-s", type=float, default=DOWNLINK_MOVE_S,
                        help="how often a session's downlink moves to a fresh request (bounds the server's "
                             "memory of a long session: docs/duplex_contract.md)")
    parser.add_argument("--certfile", type=Path, help="TLS certificate (PEM); with --keyfile")
    parser.add_argument("--keyfile", type=Path)
    parser.add_argument("--session-default", action="append", default=[], metavar="NAME=VALUE",
                        help="a START parameter for every session that does not set it (JSON value)")
    parser.add_argument("--hash-key", action="store_true",
                        help="print the key file line of the key read from stdin, then exit")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> GatewayConfig:
    if (args.certfile is None) != (args.keyfile is None):
        raise ValueError("--certfile and --keyfile go together")
    positive = min(args.rate_slack_s, args.init_timeout_s, args.pause_timeout_s, args.downlink_move_s) > 0
    if args.max_message_bytes < 1024 or args.max_waiting < 0 or not positive:
        raise ValueError("need --max-message-bytes >= 1024, --max-waiting >= 0, and --rate-slack-s, "
                         "--downlink-move-s and the timeouts > 0")
    return GatewayConfig(
        triton_url=args.triton, host=args.host, port=args.port, api_keys_file=args.api_keys,
        allowed_origins=tuple(args.allowed_origin), max_message_bytes=args.max_message_bytes,
        max_waiting=args.max_waiting, rate_slack_s=args.rate_slack_s, init_timeout_s=args.init_timeout_s,
        pause_timeout_s=args.pause_timeout_s, downlink_move_s=args.downlink_move_s, certfile=args.certfile,
        keyfile=args.keyfile,
        session_defaults=session_defaults(args.session_default),
    )


def session_defaults(items: list[str]) -> dict[str, Any]:
    defaults = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--session-default takes NAME=VALUE, got {item!r}")
        try:
            defaults[name] = json.loads(text)
        except json.JSONDecodeError:
            defaults[name] = text
    return defaults
