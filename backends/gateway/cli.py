"""`minicpmo-gateway`: run the gateway until SIGINT/SIGTERM (config.py has the options)."""
from __future__ import annotations

import logging
import ssl
import sys

from aiohttp import web

from backends.gateway.app import make_app
from backends.gateway.auth import key_line
from backends.gateway.config import GatewayConfig, config_of, parse_args


def ssl_context(config: GatewayConfig) -> ssl.SSLContext | None:
    if config.certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.certfile, config.keyfile)
    return context


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.hash_key:
        print(key_line(sys.stdin.readline().strip()))
        return 0
    try:
        config = config_of(args)
    except ValueError as err:
        print(f"minicpmo-gateway: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    web.run_app(make_app(config), host=config.host, port=config.port, ssl_context=ssl_context(config),
                shutdown_timeout=config.drain_timeout_s + 5.0, print=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
