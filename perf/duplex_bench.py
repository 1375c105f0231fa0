"""Duplex realtime benchmark: TTFT, TTFP, RTF and playback underruns at C concurrent sessions.

    python -m perf.duplex_bench --profile cpu --concurrency 1,2            # starts its own server
    python -m perf.duplex_bench --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics
    python -m perf.duplex_bench --profile cpu --concurrency 1 --via gateway  # direct gRPC and gateway

The Seed-TTS duplex realtime benchmark of vLLM-Omni
(docs/metrics.md#the-duplex-realtime-benchmark) on our `duplex` model: each turn is its own
session opened with a bundled English sentence as `initial_user_text` and a bundled voice as
REF_AUDIO; the client streams 16 kHz silence in real time in 200 ms appends until `response.done`;
4 turns per group; at concurrency C, 2 x C groups with C in flight. Reply shape (random weights):
4-6 speaking units of 4 text tokens by default. Writes <out>/<name>.json (raw, every turn), .md
(tables) and .png (TTFP and RTF against C; next to vLLM-Omni's published numbers for the
full-model GPU profiles). `--via gateway` runs every level twice in one run, direct over gRPC
and through a WebSocket gateway started here (perf/gateway_turn.py), writes <name>-gateway.*
beside <name>.* and prints the TTFP the gateway adds per level.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from client.url import grpc_targets, http_url
from perf.bench_plot import plot_levels
from perf.bench_report import render_markdown, write_json
from perf.duplex_levels import LevelPlan, LevelResult, run_level, warm_up
from perf.gpu_memory import read_memory_mib
from perf.switches import active_switches
from perf.turn import TurnOptions
from perf.workload import ReplyShape, Workload

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "perf" / "out"
DEFAULT_WORKDIR = ROOT / "var"  # the launcher's


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--url", help="gRPC address of a running server (host:port or http://host:port), or a comma-separated "
                      "list of replicas that the sessions are split between (default: start one server with --profile)")
    add("--metrics-url", help="Prometheus page of that server, host:port or http://host:port[/metrics] "
                              "(comma-separated, one per replica: summed)")
    add("--workdir", type=Path, default=DEFAULT_WORKDIR,
        help="where the server started here keeps its rendered repository, checkpoint, logs and secret")
    add("--profile", default="cpu", help="profile of the server started here (cpu | gpu); recorded as given with --url")
    add("--set", action="append", default=[], metavar="NAME=VALUE", help="override a server variable")
    add("--concurrency", default="1,2", help="comma-separated levels C")
    add("--turns-per-group", type=int, default=4)
    add("--groups-per-slot", type=int, default=2, help="num_prompts = this x C")
    add("--num-groups", type=int, help="fixed number of groups per level (overrides --groups-per-slot)")
    add("--reply-units-min", type=int, default=4)
    add("--reply-units-max", type=int, default=6)
    add("--reply-tokens-per-unit", type=int, default=4)
    add("--append-ms", type=int, default=200)
    add("--max-silence-s", type=float, default=30.0, help="most silence streamed per turn")
    add("--stagger-s", type=float, default=0.1, help="start delay between the C workers")
    add("--warmup-turns", type=int, default=1, help="unmeasured turns before the first level")
    add("--seed", type=int, default=0)
    add("--level-budget-s", type=float, default=0.0,
        help="start no new turn after this many seconds of a level (0 = no limit); the rest is reported skipped")
    add("--name", default="duplex", help="file stem of the outputs")
    add("--title", default="Duplex realtime benchmark")
    add("--out", type=Path, default=DEFAULT_OUT)
    add("--commit", help="commit id to record (default: git HEAD of this tree, if it is a checkout)")
    add("--note", action="append", default=[], help="a line for the report's Notes section (repeatable)")
    add("--via", choices=("grpc", "gateway"), default="grpc",
        help="gateway: also run each level through a WebSocket gateway in front of the server and compare")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        levels = parse_levels(args.concurrency)
        normalize_urls(args)
        shape = ReplyShape(args.reply_units_min, args.reply_units_max, args.reply_tokens_per_unit)
        workload = Workload.load(shape)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = run_meta(args, argv, shape)
    with _server(args, max(levels)) as (url, metrics_url):
        options = [TurnOptions(url=one, append_ms=args.append_ms, max_silence_s=args.max_silence_s)
                   for one in url.split(",") if one.strip()]
        results = run_all(args, levels, workload, options, metrics_url,
                          lambda done: write_outputs(args.out, args.name, args.title, meta, done))
        if args.via == "gateway":
            results += run_via_gateway(args, levels, workload, options[0], metrics_url, meta, results)
    failed = sum(r.summary.failed_turns for r in results)
    return 1 if failed else 0


def run_via_gateway(args: argparse.Namespace, levels: list[int], workload: Workload, direct: TurnOptions,
                    metrics_url: str | None, meta: dict[str, Any], direct_results: list[LevelResult]) -> list[LevelResult]:
    """The same levels through a gateway in front of the first replica; the TTFP it adds."""
    import dataclasses

    from perf.bench_gateway import gateway_in_front, print_added_ttfp

    with gateway_in_front(direct.url, args.out) as gateway_url:
        options = [dataclasses.replace(direct, gateway_url=gateway_url)]
        results = run_all(args, levels, workload, options, metrics_url,
                          lambda done: write_outputs(args.out, f"{args.name}-gateway", f"{args.title} (via gateway)",
                                                     meta, done))
    print_added_ttfp(direct_results, results)
    return results


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"--concurrency must be comma-separated integers, got {text!r}") from exc
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency needs levels >= 1, got {text!r}")
    return levels


def run_all(args: argparse.Namespace, levels: list[int], workload: Workload, options: list[TurnOptions],
            metrics_url: str | None, on_level: Callable[[list[LevelResult]], None] | None = None) -> list[LevelResult]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    warm = [record for replica in options for record in warm_up(workload, replica, run_id, args.warmup_turns)]
    if warm and not all(record.ok for record in warm):
        print(f"warning: warm-up turn failed: {[r.report.errors for r in warm]}", file=sys.stderr)
    results = []
    for concurrency in levels:
        num_groups = args.num_groups or args.groups_per_slot * concurrency
        plan = LevelPlan(concurrency, num_groups, args.turns_per_group, args.stagger_s, args.seed + concurrency,
                         args.level_budget_s)
        result = run_level(plan, workload, options, run_id, metrics_url)
        _print_level(result)
        results.append(result)
        if on_level is not None:
            on_level(results)  # outputs after every level: a run cut short keeps what it measured
    return results


def write_outputs(out: Path, name: str, title: str, meta: dict[str, Any], results: list[LevelResult]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    levels = [result.to_json() for result in results]
    write_json(out / f"{name}.json", meta, levels)
    (out / f"{name}.md").write_text(render_markdown(title, meta, levels), encoding="utf-8")
    if not plot_levels(out / f"{name}.png", title, levels, meta):
        print("note: matplotlib is not installed (pip install -e .[plot]); no plot written", file=sys.stderr)
    print(f"wrote {out / name}.json, .md, .png")


def run_meta(args: argparse.Namespace, argv: list[str] | None, shape: ReplyShape) -> dict[str, Any]:
    return {
        "command": "python -m perf.duplex_bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        "commit": args.commit or _commit(), "device": describe_device(),
        "profile": f"{args.profile} (server started separately)" if args.url else args.profile,
        "workload": (f"{args.turns_per_group} turns per group, {args.num_groups or f'{args.groups_per_slot} x C'} "
                     f"groups, replies of {shape.describe()}, {args.append_ms} ms appends of silence, "
                     f"stagger {args.stagger_s} s, seed {args.seed}"),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "switches": active_switches(),
        "notes": list(args.note),
    }


def describe_device() -> str:
    gpus = _gpu_names()
    if gpus:
        return ", ".join(gpus)
    return f"CPU: {_cpu_model()} ({os.cpu_count()} cores), {platform.system()}"


def normalize_urls(args: argparse.Namespace) -> None:
    """Either address form in, the forms the gRPC client and the scraper take out (client/url.py)."""
    if args.url:
        args.url = ",".join(grpc_targets(args.url))
    if args.metrics_url:
        pages = [http_url(item, default_path="/metrics") for item in args.metrics_url.split(",") if item.strip()]
        args.metrics_url = ",".join(pages)


@contextlib.contextmanager
def _server(args: argparse.Namespace, max_concurrency: int) -> Iterator[tuple[str, str | None]]:
    if args.url:
        yield args.url, args.metrics_url
        return
    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    overrides = dict(item.split("=", 1) for item in args.set)
    profile = get_profile(args.profile).with_overrides(overrides)
    if profile.max_sessions < max_concurrency:
        profile = profile.with_overrides({"max_sessions": str(max_concurrency)})
    with ServerProcess(ServerOptions(profile=profile, workdir=args.workdir)) as server:
        print(f"server ready: {server.grpc_url} (profile {profile.name}, log {server.log_file})", flush=True)
        yield server.grpc_url, f"http://{server.options.address}:{server.metrics_port}/metrics"


def _print_level(result: LevelResult) -> None:
    s, m = result.summary, result.summary.metrics
    print(f"C={s.concurrency}: {s.num_turns} turns ({s.failed_turns} failed, {s.num_errors} errors) in "
          f"{s.duration_s:.1f} s | TTFP srv mean {m['server_ttfp_ms'].mean} p99 {m['server_ttfp_ms'].p99} | "
          f"client mean {m['client_ttfp_ms'].mean} | RTF median {m['rtf'].median} p99 {m['rtf'].p99}", flush=True)


def _commit() -> str:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (uncommitted changes)" if dirty else "")


def _gpu_names() -> list[str]:
    if read_memory_mib() is None:
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=10).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
