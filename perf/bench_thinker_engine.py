"""Thinker engine in-process: unit latency and step cost with C paced duplex sessions.

What the served Thinker does per session, without Triton around it: each session starts with
`initial_user_text` and the reply-shape knobs of the duplex benchmark, then appends one 1 s
unit of silence every second (staggered), and the engine thread's loop (submit what is due,
step while there is work, and submit what falls due while a step is on the GPU, as the engine
thread's in-step drain does) runs here on the main thread.
Per level it prints the unit latency (append due -> unit result, so it includes the wait for
the step in progress: what the duplex benchmark's server TTFT/TTFP start with),
the engine steps per unit and their wall time, then a line with the steps split by kind
(decodes only, or with some session's append rows) and the sessions a step carried on average,
and with `--profile` the functions that took
the host time (cProfile, cumulative).

    python3 perf/bench_thinker_engine.py --concurrency 1,8,32 --seconds 8 [--profile 8]
    python3 perf/bench_thinker_engine.py --concurrency 1 --seconds 4 --torch-profile 1 [--trace t.json]
    (CPU smoke test: --device cpu --checkpoint tiny --dtype float32)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.contracts.messages import ThinkerRequest  # noqa: E402
from backends.contracts.sink import ListSink  # noqa: E402
from backends.stages.factory import build_thinker_engine  # noqa: E402
from backends.thinker.prompt_layout import UNIT_SAMPLES  # noqa: E402
from perf.distribution import Distribution  # noqa: E402

PROMPT = "Tell me about the weather on the coast this weekend, please."


@dataclass
class _Session:
    index: int
    start_s: float
    seq: int = 0
    pending: list[tuple[float, ListSink, int]] = field(default_factory=list)  # (sent, sink, seq)

    @property
    def request_id(self) -> str:
        return f"bench{self.index}.e0"


def _request(session: _Session, args: argparse.Namespace) -> ThinkerRequest:
    first = session.seq == 0
    return ThinkerRequest(
        request_id=session.request_id, audio=np.zeros(UNIT_SAMPLES, np.float32), seq=session.seq,
        initial_user_text=PROMPT if first else "", seed=session.index,
        reply_units=args.reply_units if first else 0,
        reply_tokens_per_unit=args.tokens_per_unit if first else 0,
    )  # fmt: skip


class _StepKinds:
    """Stands in for the runner's `launch_step` to note what each step carried: "decode" (one
    row per session) or "append" (some session's append rows, alone or beside decodes), and
    how many sessions."""

    def __init__(self, runner) -> None:
        self.launch_step = runner.launch_step
        self.last: tuple[str, int] | None = None

    def __call__(self, inputs):
        self.last = ("decode" if all(i.num_rows == 1 for i in inputs) else "append", len(inputs))
        return self.launch_step(inputs)


def _run_level(engine, concurrency: int, args: argparse.Namespace) -> dict[str, object]:
    t0 = time.perf_counter()
    sessions = [_Session(i, t0 + i * args.stagger_s) for i in range(concurrency)]
    latencies, first_latencies, step_times = [], [], []
    kinds = _StepKinds(engine.runner)
    engine.runner.launch_step = kinds  # the instance attribute shadows the method for the level
    by_kind: dict[str, list[float]] = {"decode": [], "append": []}
    rows: list[int] = []
    end = t0 + args.seconds

    def submit_due() -> None:
        now = time.perf_counter()
        for s in sessions:
            due = s.start_s + s.seq  # one unit per second per session
            if now < end and now >= due:
                sink = ListSink()
                engine.submit(_request(s, args), sink)
                s.pending.append((due, sink, s.seq))
                s.seq += 1

    # as the engine thread does: appends that fall due during a step are taken inside it
    engine.attach_in_flight_drain(submit_due)
    while time.perf_counter() < end or engine.has_work():
        submit_due()
        if engine.has_work():
            started = time.perf_counter()
            engine.step()
            step_times.append(time.perf_counter() - started)
            if kinds.last is not None:
                by_kind[kinds.last[0]].append(step_times[-1])
                rows.append(kinds.last[1])
                kinds.last = None
        else:
            time.sleep(0.0005)
        _collect(sessions, latencies, first_latencies)
    del engine.runner.launch_step
    for s in sessions:
        engine.stop(s.request_id)
    return {"C": concurrency, "units": len(latencies) + len(first_latencies),
            "first_unit_ms": Distribution.of(x * 1e3 for x in first_latencies),
            "unit_ms": Distribution.of(x * 1e3 for x in latencies),
            "steps": len(step_times), "step_ms": Distribution.of(x * 1e3 for x in step_times),
            "kinds": {k: Distribution.of(x * 1e3 for x in v) for k, v in by_kind.items()},
            "rows": float(np.mean(rows)) if rows else 0.0}


def _kinds_line(result: dict[str, object]) -> str:
    """Where the level's step time went: steps by kind (count, wall ms mean / P99) and the
    sessions a step carried on average."""
    parts = [f"{kind} {d.count} x {_ms(d.mean)} / {_ms(d.p99)} ms" for kind, d in result["kinds"].items()]
    return f"  C = {result['C']} steps: {'; '.join(parts)}; {result['rows']:.1f} sessions a step"


def _collect(sessions: list[_Session], latencies: list[float], first: list[float]) -> None:
    now = time.perf_counter()
    for s in sessions:
        for sent, sink, seq in [p for p in s.pending if p[1].closed]:
            if sink.error is not None:
                raise RuntimeError(f"{s.request_id}: {sink.error}")
            (first if seq == 0 else latencies).append(now - sent)
        s.pending = [p for p in s.pending if not p[1].closed]


def _row(result: dict[str, object]) -> str:
    unit, first, step = result["unit_ms"], result["first_unit_ms"], result["step_ms"]
    per_unit = result["steps"] / max(1, result["units"])
    return (f"| {result['C']} | {result['units']} | {_ms(first.mean)} | {_ms(unit.mean)} / "
            f"{_ms(unit.median)} / {_ms(unit.p99)} | {per_unit:.1f} | {_ms(step.mean)} / {_ms(step.p99)} |")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _torch_profiled_level(engine, concurrency: int, args: argparse.Namespace) -> dict[str, object]:
    """The level under torch.profiler; prints the host ops by self CPU time (the host work of
    the steps: launches, copies, syncs) and the CUDA kernels by device time."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        result = _run_level(engine, concurrency, args)
    table = prof.key_averages()
    print(f"\ntorch.profiler at C={concurrency}, host ops by self CPU time:")
    print(table.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
    print("CUDA kernels by device time:")
    print(table.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=70))
    if args.trace:
        prof.export_chrome_trace(args.trace)  # chrome://tracing or perfetto: the steps' gaps
        print(f"trace written to {args.trace}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stagger-s", type=float, default=0.03)
    parser.add_argument("--reply-units", type=int, default=5)
    parser.add_argument("--tokens-per-unit", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--checkpoint", default="full-random")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-sessions", type=int, default=0,
                        help="runner sized for this many sessions (default: the largest C)")
    parser.add_argument("--profile", type=int, default=0, help="cProfile the level with this C")
    parser.add_argument("--torch-profile", type=int, default=0,
                        help="torch.profiler (host ops and CUDA kernels) over the level with this C")
    parser.add_argument("--trace", default="", help="with --torch-profile: also write its Chrome trace here")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    params = {"device": args.device, "checkpoint": args.checkpoint, "dtype": args.dtype,
              "max_sessions": str(args.max_sessions or max(levels)), "max_context_tokens": "8192"}
    started = time.perf_counter()
    engine = build_thinker_engine(params)
    print(f"engine built in {time.perf_counter() - started:.1f} s; warm-up level", flush=True)
    _run_level(engine, 1, argparse.Namespace(**{**vars(args), "seconds": 2.0}))
    print("| C | units | first unit ms (prompt + unit) | unit ms mean / median / P99 | steps per unit "
          "| step ms mean / P99 |\n|---|---|---|---|---|---|")
    for c in levels:
        profiler = cProfile.Profile() if c == args.profile else None
        if profiler is not None:
            profiler.enable()
        if c == args.torch_profile:
            result = _torch_profiled_level(engine, c, args)
        else:
            result = _run_level(engine, c, args)
        if profiler is not None:
            profiler.disable()
        print(_row(result), flush=True)
        print(_kinds_line(result), flush=True)
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(30)
            print(f"\ncProfile at C={c} (cumulative, then own time):\n{out.getvalue()}", flush=True)


if __name__ == "__main__":
    main()
