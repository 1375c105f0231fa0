"""The README's main job: start the server on the tiny model, hold one duplex conversation.

    minicpmo-demo [--input client/data/hello_16k.wav] [--output reply.wav] [client options]

Starts tritonserver (cpu profile, free loopback ports), streams the bundled wav in real time
with `initial_user_text` set so the model answers, writes the reply wav, prints latencies,
and stops the server whatever happens.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
from backends.serving.profiles import get_profile

DEFAULT_INPUT = PROJECT_ROOT / "client" / "data" / "hello_16k.wav"
DEFAULT_PROMPT = "Hello! Please tell me about the weather today."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--output", type=Path, default=Path("reply.wav"))
    parser.add_argument("--initial-user-text", default=DEFAULT_PROMPT)
    args, client_args = parser.parse_known_args(argv)
    from client.cli import main as client_main

    with ServerProcess(ServerOptions(profile=get_profile(args.profile))) as server:
        print(f"server ready on {server.grpc_url} (log {server.log_file})", flush=True)
        return client_main([
            "--url", server.grpc_url, "--input", str(args.input), "--output", str(args.output),
            "--initial-user-text", args.initial_user_text, *client_args,
        ])


if __name__ == "__main__":
    sys.exit(main())
