"""What one stage call of the orchestrator costs on top of the stage's own work.

The `duplex` model calls the stages over gRPC streams to its own server
(backends/serving/stage_channel.py). This times `StageChannel.call` of a request each stage
answers at once (a `stop` of an unknown id: no engine work), per stage, two ways in turns:
`kept` (the served behaviour: the stream stays open between calls) and `fresh` (the stream is
closed after every call, so each call opens one, as the orchestrator did before). Starts its own
cpu-profile server on the tiny checkpoint unless `--url` names a running one (then
`--stage-secret-file` names its stage secret, which the stages want on every request but `health`).

    python perf/bench_stage_calls.py [--calls 200] [--rounds 2] [--url HOST:PORT --stage-secret-file F]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.contracts.messages import stop_request  # noqa: E402
from backends.contracts.stage_clients import STAGES  # noqa: E402
from backends.contracts.tensor_codec import to_arrays  # noqa: E402
from backends.serving.stage_channel import StageChannel  # noqa: E402
from backends.serving.stage_secret import read_secret_file  # noqa: E402

MODES = ("fresh", "kept")


def time_calls(channel: StageChannel, stage: str, calls: int, mode: str) -> float:
    """Mean ms per call over `calls` calls (after 20 untimed ones)."""
    arrays = to_arrays(stop_request(stage, "bench-unknown-id"))

    def one() -> None:
        list(channel.call(stage, arrays))
        if mode == "fresh":
            channel.end_stream()

    for _ in range(20):
        one()
    started = time.perf_counter()
    for _ in range(calls):
        one()
    return (time.perf_counter() - started) / calls * 1e3


def bench(url: str, calls: int, rounds: int,
          channel_factory: Callable[[str, float], StageChannel] = StageChannel) -> dict[str, dict[str, list[float]]]:
    """stage -> mode -> mean ms per call of each round (modes alternate within a round)."""
    results: dict[str, dict[str, list[float]]] = {}
    for stage in STAGES:
        channel = channel_factory(url, 30.0)
        try:
            per_mode = results.setdefault(stage, {mode: [] for mode in MODES})
            for _ in range(rounds):
                for mode in MODES:
                    per_mode[mode].append(time_calls(channel, stage, calls, mode))
        finally:
            channel.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--url", default="", help="a running server's gRPC host:port (default: start one)")
    parser.add_argument("--stage-secret-file", type=Path, default=None, help="that server's stage secret file")
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.url:
            url, secret = args.url, read_secret_file(args.stage_secret_file) if args.stage_secret_file else None
        else:
            server = stack.enter_context(_tiny_server())
            url, secret = server.grpc_url, server.stage_secret
        results = bench(url, args.calls, args.rounds, functools.partial(StageChannel, secret=secret))
    print("| stage | stream per call, ms | kept stream, ms | saved, ms |")
    print("| --- | ---: | ---: | ---: |")
    for stage, per_mode in results.items():
        fresh, kept = (statistics.median(per_mode[mode]) for mode in MODES)
        print(f"| {stage} | {fresh:.2f} | {kept:.2f} | {fresh - kept:.2f} |")


def _tiny_server():
    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    return ServerProcess(ServerOptions(profile=get_profile("cpu")))


if __name__ == "__main__":
    main()
