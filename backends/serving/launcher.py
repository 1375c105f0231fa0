"""Start tritonserver on the model repository for a profile, wait for readiness, stop cleanly.

    minicpmo-server --profile cpu [--grpc-port 8001] [--set max_sessions=8] [--log-file F]
                    [--gateway-port 8080 [--gateway-api-keys FILE]]
    minicpmo-server --profile gpu --render-only DIR     # the rendering alone, for a plain tritonserver

Binds to loopback unless --address is given. The README's main job runs it; the test fixtures
and the benchmarks start servers through `ServerProcess` (backends/serving/server_process.py).
The launcher supervises its server (backends/serving/supervisor.py) until SIGINT or SIGTERM.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from backends.serving.card_memory import card_memory_gib, check_card
from backends.serving.gateway_process import GatewayChild, GatewayOptions
from backends.serving.metrics_stage_calls import call_metrics_enabled
from backends.serving.mps import MODES as MPS_MODES
from backends.serving.profiles import get_profile
from backends.serving.server_process import (DEFAULT_REPOSITORY, DEFAULT_WORKDIR, ServerOptions, ServerProcess,
                                             render_only, write_endpoints)
from backends.serving.supervisor import Supervisor, SupervisorPolicy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu", help="cpu | gpu | gpu-split (deploy/README.md)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a configuration variable (README table)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--log-file", type=Path)
    parser.add_argument("--mps", default="auto", choices=MPS_MODES,
                        help="CUDA MPS daemon for the stage processes sharing a GPU (auto: on for GPU profiles)")
    parser.add_argument("--max-restarts", type=int, default=SupervisorPolicy().max_restarts,
                        help="restarts of a server that died or failed its readiness probes, within "
                             "--restart-window-s, before the launcher gives up and exits 1 (0: never restart)")
    parser.add_argument("--restart-window-s", type=float, default=SupervisorPolicy().restart_window_s)
    parser.add_argument("--render-only", type=Path, default=None, metavar="DIR",
                        help="write the repository rendered for the profile into DIR, print the plain "
                             "tritonserver command that serves it, and exit without starting a server")
    parser.add_argument("--server-id", default=None,
                        help="name of this replica (Triton --id; the `name` of server metadata)")
    parser.add_argument("--gateway-port", type=int, default=0,
                        help="also run the WebSocket gateway (minicpmo-gateway) on this port, on --address "
                             "(0: no gateway; docs/gateway.md)")
    parser.add_argument("--gateway-api-keys", type=Path, help="the gateway's API key file (--api-keys)")
    return parser.parse_args(argv)


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The options the command line and the environment ask for; ValueError names what is wrong
    (a profile, a `--set` variable, the stage-call diagnostics' setting the models read)."""
    call_metrics_enabled()
    if args.max_restarts < 0 or args.restart_window_s <= 0:
        raise ValueError("--max-restarts must be >= 0 and --restart-window-s > 0")
    malformed = [item for item in args.set if "=" not in item]
    if malformed:
        raise ValueError(f"--set takes NAME=VALUE, got {malformed}")
    profile = get_profile(args.profile).with_overrides(dict(item.split("=", 1) for item in args.set))
    profile.memory_fractions()  # a planned profile that does not fit is refused here, before any start
    if profile.gpu_memory_gib > 0:
        check_card(profile.name, profile.gpu_memory_gib, card_memory_gib(profile.stage_gpu("thinker") or 0))
    return ServerOptions(
        profile=profile, repository=args.repository, workdir=args.workdir, address=args.address,
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port, log_file=args.log_file,
        mps=args.mps, extra_args=[f"--id={args.server_id}"] if args.server_id else [],
        supervisor=SupervisorPolicy(max_restarts=args.max_restarts, restart_window_s=args.restart_window_s),
    )


def start_gateway(args: argparse.Namespace, server: ServerProcess) -> GatewayChild | None:
    """The gateway child when --gateway-port asks for one, started (the server is ready)."""
    if not args.gateway_port:
        return None
    log_file = server.log_file.with_name(f"gateway-{args.gateway_port}.log")
    gateway = GatewayChild(GatewayOptions(args.gateway_port, args.gateway_api_keys), args.address,
                           server.stage_url, log_file)
    gateway.start()
    print(f"gateway on port {args.gateway_port} (ws /v1/realtime, /ws/duplex/ID; page /), log {log_file}", flush=True)
    return gateway


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        options = server_options(args)
    except ValueError as err:  # a usage error: one line, no traceback, nothing started
        print(f"minicpmo launcher: {err}", file=sys.stderr)
        return 2
    if options.profile.gpu_memory_gib > 0:  # the plan beside the stages' post-warm-up allocation logs
        print(f"memory plan of profile {options.profile.name}:\n{options.profile.memory_plan().table()}", flush=True)
    if args.render_only is not None:
        return render_only(options, args.render_only)
    server = ServerProcess(options)
    stop_requested: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))
    server.start()
    print(f"tritonserver ready: grpc {server.grpc_url}, http {server.http_url}, log {server.log_file}, "
          f"stage secret file {server.stage_secret_file}", flush=True)
    endpoints = write_endpoints(server)
    gateway = start_gateway(args, server)
    try:
        supervisor = Supervisor(server, options.supervisor, say=lambda line: print(line, file=sys.stderr, flush=True))
        given_up = supervisor.run(lambda: bool(stop_requested))
    finally:
        if gateway is not None:
            print(f"gateway stopped (exit {gateway.stop()})", flush=True)
        endpoints.unlink(missing_ok=True)
    code = server.stop()
    print(f"tritonserver stopped (exit {code})", flush=True)
    return 1 if given_up else 0



if __name__ == "__main__":
    sys.exit(main())
