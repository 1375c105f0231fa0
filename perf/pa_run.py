"""Run perf_analyzer on a stage model (streaming) or on `duplex` (sequence mode), then report
first-response and inter-response latencies from its profile export.

    python -m perf.pa_run --model thinker --url 127.0.0.1:8001 --stage-secret-file F [--sessions 4]
    python -m perf.pa_run --model talker --checkpoint full-random --url ...
    python -m perf.pa_run --model duplex --url 127.0.0.1:8001 --sequences 2 --seconds 12

Stage models: `--sessions N` runs N perf_analyzer processes side by side, each replaying its
own scripted session at concurrency 1 (their state is per request id, see pa_inputs), so the
stage sees N concurrent sessions. `duplex`: request-rate mode at 1000 / append_ms requests per
second per sequence (real-time appends) over `--sequences` sequences; concurrency mode cannot
drive it, because a sequence's START request stays open for the whole session.

A stage model serves only requests that carry the server's stage secret
(backends/serving/stage_secret.py): `--stage-secret-file` names the file the launcher wrote
(its start-up line prints the path) and every stage request carries it (perf_analyzer's
`--request-parameter`, which puts it on perf_analyzer's command line: run it on a machine whose
other users may see the server's internals anyway). Without it the stage answers `[forbidden]`.

perf_analyzer (tritonclient[all]==2.51.0) needs `libb64-0d` (apt) and libcudart.so.12 (PyPI
nvidia-cuda-runtime-cu12); its directory is put on LD_LIBRARY_PATH here. Writes
<out>/<model>[_<i>].json (input data), <model>[_<i>]_export.json and <model>_latency.json.
When perf_analyzer fails (it cannot start, the server refuses it) the latency JSON holds the
error and the end of its output instead of numbers, printed to stderr too, and the exit code is 1.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from client.url import grpc_target

from backends.contracts.stage_clients import StageCallError
from backends.serving.stage_secret import SECRET_PARAMETER, read_secret_file
from perf.pa_inputs import STAGES, StageDims, duplex_data, session_request_id, stage_data
from perf.pa_latency import duplex_latency, load_requests, stream_latency, to_json

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "pa"
LOG_TAIL_LINES = 12  # of a failed perf_analyzer's output, reported with the error


def perf_analyzer_binary() -> str:
    found = shutil.which("perf_analyzer") or str(Path(sys.executable).with_name("perf_analyzer"))
    if not Path(found).is_file():
        raise FileNotFoundError("perf_analyzer not found: pip install 'tritonclient[all]==2.51.0'")
    return found


def pa_environment() -> dict[str, str]:
    """The environment with libcudart.so.12's folder on LD_LIBRARY_PATH, when installed."""
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime  # type: ignore[import-not-found]
    except ImportError:
        return env
    lib = Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def stage_secret(args: argparse.Namespace) -> str | None:
    return read_secret_file(args.stage_secret_file) if args.stage_secret_file else None


def secret_arguments(secret: str | None) -> list[str]:
    """perf_analyzer's arguments that send the stage secret on every request."""
    return ["--request-parameter", f"{SECRET_PARAMETER}:{secret}:string"] if secret else []


def stage_command(args: argparse.Namespace, data: Path, export: Path, secret: str | None = None) -> list[str]:
    return [perf_analyzer_binary(), "-m", args.model, "-u", args.url, "-i", "grpc", "--streaming",
            "--input-data", str(data), "--concurrency-range", "1", "--measurement-mode", "count_windows",
            "--measurement-request-count", str(args.window_requests), "--max-trials", "3",
            "--stability-percentage", "999", "--profile-export-file", str(export), *secret_arguments(secret)]


def duplex_command(args: argparse.Namespace, data: Path, export: Path) -> list[str]:
    rate = args.sequences * 1000.0 / args.append_ms
    return [perf_analyzer_binary(), "-m", "duplex", "-u", args.url, "-i", "grpc", "--streaming",
            "--input-data", str(data), "--request-rate-range", f"{rate:g}",
            "--num-of-sequences", str(args.sequences), "--measurement-interval", str(args.window_ms),
            "--max-trials", "3", "--stability-percentage", "999", "--profile-export-file", str(export)]


def run_stage(args: argparse.Namespace) -> dict:
    dims = StageDims.for_checkpoint(args.checkpoint) if args.model == "talker" else None
    secret = stage_secret(args)
    procs, exports = [], []
    for session in range(args.sessions):
        data, export = args.out / f"{args.model}_{session}.json", args.out / f"{args.model}_{session}_export.json"
        data.write_text(json.dumps(stage_data(args.model, session, args.units, dims)))
        procs.append(_spawn(stage_command(args, data, export, secret), args.out / f"{args.model}_{session}.log"))
        exports.append(export)
    codes = _wait(procs, args.timeout_s)
    logs = [args.out / f"{args.model}_{session}.log" for session in range(args.sessions)]
    failure = run_failure(codes, exports, logs)
    if failure is not None:
        with contextlib.suppress(StageCallError):  # the server may be what failed: its error is reported
            stop_sessions(args.url, args.model, args.sessions, secret)
        return {"model": args.model, "sessions": args.sessions, **failure}
    stop_sessions(args.url, args.model, args.sessions, secret)
    requests = [r for export in exports for r in load_requests(export)]
    return {"model": args.model, "sessions": args.sessions, **to_json(stream_latency(requests))}


def stop_sessions(url: str, model: str, sessions: int, secret: str | None = None) -> None:
    """Stop the scripted sessions' requests: perf_analyzer ends a run wherever its window ends,
    often before a session's closing `stop`, and a stage keeps a request until it is stopped."""
    from backends.serving.grpc_stages import GrpcStageClients

    stages = GrpcStageClients(url, secret=secret)
    try:
        for session in range(sessions):
            stages.stop(model, session_request_id(model, session))
    finally:
        stages.close()


def run_duplex(args: argparse.Namespace) -> dict:
    from perf.workload import load_voices

    voices = load_voices()
    data, export = args.out / "duplex.json", args.out / "duplex_export.json"
    data.write_text(json.dumps(duplex_data(voices[sorted(voices)[0]], args.seconds, 1, args.append_ms)))
    log = args.out / "duplex.log"
    codes = _wait([_spawn(duplex_command(args, data, export), log)], args.timeout_s)
    failure = run_failure(codes, [export], [log])
    if failure is not None:
        return {"model": "duplex", "sequences": args.sequences, **failure}
    return {"model": "duplex", "sequences": args.sequences, **to_json(duplex_latency(load_requests(export)))}


def run_failure(codes: list[int], exports: list[Path], logs: list[Path]) -> dict | None:
    """None when every perf_analyzer process exited 0 and wrote its export; else the first
    failure's exit code, the end of its output (where perf_analyzer and the loader say why:
    a missing library, an unreachable server, a refused request) and its log's path."""
    for code, export, log in zip(codes, exports, logs):
        if code != 0 or not export.is_file():
            return {"error": f"perf_analyzer exited with {code}" + ("" if export.is_file() else
                                                                    ", writing no profile export"),
                    "output": log_tail(log), "log": str(log)}
    return None


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"(no output: {exc})"
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=pa_environment())


def _wait(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Each process's exit code (negative: killed, here after `timeout_s`)."""
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--model", required=True, choices=(*STAGES, "duplex"))
    add("--url", default="127.0.0.1:8001", help="gRPC address: host:port or http://host:port")
    add("--stage-secret-file", type=Path, default=None,
        help="stage models: the server's stage secret file (the launcher prints its path)")
    add("--checkpoint", default="tiny", help="tiny | full-random | a directory (the talker's hidden width)")
    add("--sessions", type=int, default=1, help="stage models: parallel scripted sessions")
    add("--units", type=int, default=5, help="stage models: units per scripted session")
    add("--window-requests", type=int, default=12, help="stage models: requests per measurement window")
    add("--sequences", type=int, default=1, help="duplex: concurrent sequences (sessions)")
    add("--seconds", type=float, default=12.0, help="duplex: audio per sequence")
    add("--append-ms", type=int, default=200, help="duplex: audio per request")
    add("--window-ms", type=int, default=15000, help="duplex: measurement window")
    add("--timeout-s", type=float, default=600.0)
    add("--out", type=Path, default=DEFAULT_OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sessions < 1 or args.sequences < 1 or args.units < 1:
        print("error: --sessions, --sequences and --units must be >= 1", file=sys.stderr)
        return 2
    try:
        args.url = grpc_target(args.url)
    except ValueError as exc:
        print(f"error: --url: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_duplex(args) if args.model == "duplex" else run_stage(args)
    except (OSError, ValueError) as exc:  # no perf_analyzer, an unreadable secret file
        result = {"model": args.model, "error": f"{type(exc).__name__}: {exc}"}
    (args.out / f"{args.model}_latency.json").write_text(json.dumps(result, indent=1) + "\n")
    if "error" in result:
        print(f"error: {result['error']}\n{result.get('output', '')}".rstrip(), file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    measured = result.get("requests", result.get("sessions", 0))
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
