"""Where the Talker engine's host time goes between submits and every request's 25th frame.

    PYTHONPATH=$PWD python3 perf/profile_talker_engine.py --batch 16            # GPU, real dims
    PYTHONPATH=$PWD python3 perf/profile_talker_engine.py --batch 1,16 --tiny --device cpu

The run is `bench_audio_tail.bench_talker`'s (B mid-turn conditions of 10 handed tokens,
submitted together, then `engine.step()` until each has 25 frames), on the fast path (Triton,
interpreted on CPU) with the device chunk policy unless `--backend reference`. Per batch it
prints: runner forwards per run (the ideal: 1 prefill + ceil(24 / 8) chains at any batch), the
graphs the runner captured (a chain or bucket without its graph runs eagerly), wall ms of the
submits (their inputs made before), each step (and the engine's host
share of it: the step minus the runner's forward and wait) and the stops, each with its
device-op count (aten ops dispatched outside kernels: on the GPU each is a launch or a copy),
then the top cProfile rows (our code only, by default) of one more run. `--sources` adds
each phase's top issuing lines of our code (outside the forward).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from backends.runner.types import RunnerConfig  # noqa: E402
from backends.stages.talker_engine import TalkerEngine  # noqa: E402
from perf.bench_audio_tail import (  # noqa: E402
    FRAMES, MAX_STEPS, _frames, condition_inputs, submit_condition, talker_model,
)  # fmt: skip


class OpCounter(TorchDispatchMode):
    """Counts aten ops dispatched (a proxy for kernel launches and copies on the GPU); an
    interpreted Triton kernel counts as one op ("triton"), not as the torch ops it runs.

    With `sources`, also counts each op by the innermost line of our code that issued it
    ("forward" for everything under the decoder's forward, graphed on the GPU), which shows
    the per-request host work (state-table writes, staging copies) between forwards."""

    inside_kernel = False
    sources_on = False  # set by --sources: walking the stack per op is slow

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not OpCounter.inside_kernel:
            self.ops[str(func.overloadpacket.__name__)] += 1
            if OpCounter.sources_on:
                self.sources[_source()] += 1
        return func(*args, **(kwargs or {}))


def _source() -> str:
    """'file:function:line' of the innermost frame under backends/, or 'forward'."""
    ours = [f for f in traceback.extract_stack()[:-2] if f"{os.sep}backends{os.sep}" in f.filename]
    if any(f.filename.endswith("decoder_backbone.py") for f in ours):
        return "forward"
    if not ours:
        return "other"
    frame = ours[-1]
    return f"{frame.filename.split(os.sep + 'backends' + os.sep)[-1]}:{frame.name}:{frame.lineno}"


def _count_interpreted_kernels() -> None:
    """On CPU: an interpreted kernel launch is one op of the counter."""
    if torch.cuda.is_available():
        return
    from triton.runtime.interpreter import GridExecutor

    inner = GridExecutor.__call__

    def call(self: GridExecutor, *args: object, **kwargs: object) -> object:
        mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        if isinstance(mode, OpCounter):
            mode.ops["triton"] += 1
        OpCounter.inside_kernel = True
        try:
            return inner(self, *args, **kwargs)
        finally:
            OpCounter.inside_kernel = False

    GridExecutor.__call__ = call  # type: ignore[method-assign]


def make_engine(model: torch.nn.Module, batch: int, args: argparse.Namespace) -> TalkerEngine:
    device = torch.device(args.device)
    context = 4096 if device.type == "cuda" else 256
    backend = args.backend if args.backend != "auto" else "triton"
    config = RunnerConfig(num_blocks=(batch + 2) * context // 16, max_num_reqs=batch + 2,
                          max_model_len=context, device=str(device), dtype=model.dtype_,
                          attention_backend=backend, use_cuda_graphs=device.type == "cuda",
                          cuda_graph_sizes=(1, 2, 4, 8, 16, 32), gemv_backend="triton")  # fmt: skip
    return TalkerEngine(model, config, device_policy=None)


class RunnerCalls:
    """Counts the runner's forwards (launch_step / launch_chain, per chain length) and the
    wall time spent inside `step` / `decode_chain` (forward + its one host wait), so a step's
    engine-side host time is its wall time minus this."""

    def __init__(self, engine: TalkerEngine) -> None:
        self.calls: Counter[str] = Counter()
        self.inside_s = 0.0
        runner = engine.runner
        for name in ("launch_step", "launch_chain", "step", "decode_chain"):
            setattr(runner, name, self._wrap(name, getattr(runner, name)))

    def _wrap(self, name: str, inner: Callable[..., object]) -> Callable[..., object]:
        def wrapped(*args: object) -> object:
            if name.startswith("launch"):
                self.calls[name if name == "launch_step" else f"chain_{args[1]}"] += 1
                return inner(*args)
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.inside_s += time.perf_counter() - start

        return wrapped


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(engine: TalkerEngine, batch: int, tag: str, log: list[str] | None) -> None:
    """One bench run: submit B conditions, step until all have 25 frames, stop them."""
    device = engine.runner.kv.data.device
    inputs = condition_inputs(engine.runner.model.config, batch)  # outside the timing
    ids = [f"{tag}{b}" for b in range(batch)]
    sync(device)
    start = time.perf_counter()
    with OpCounter() as ops:
        sinks = [submit_condition(engine, rid, *handoff) for rid, handoff in zip(ids, inputs)]
    _note(log, "submit", start, ops, device)
    for step in range(MAX_STEPS):
        if all(_frames(sink) >= FRAMES for sink in sinks):
            break
        if any(sink.closed and _frames(sink) < FRAMES for sink in sinks):
            raise RuntimeError(f"a condition ended early: {[s.error for s in sinks]}")
        runner_s, start = engine.runner._calls.inside_s, time.perf_counter()
        with OpCounter() as ops:
            engine.step()
        engine_s = time.perf_counter() - start - (engine.runner._calls.inside_s - runner_s)
        _note(log, f"step {step}", start, ops, device, f"engine host {1000 * engine_s:6.2f} ms")
    start = time.perf_counter()
    for request_id in ids:
        engine.stop(request_id)
    _note(log, "stop", start, OpCounter(), device)


def _note(log: list[str] | None, what: str, start: float, ops: OpCounter, device: torch.device,
          extra: str = "") -> None:
    sync(device)
    if log is not None:
        top = ", ".join(f"{name} {n}" for name, n in ops.ops.most_common(4))
        log.append(f"  {what:8s} {1000 * (time.perf_counter() - start):8.2f} ms {extra:24s} "
                   f"{sum(ops.ops.values()):5d} ops ({top})")
        log.extend(f"           {n:5d} {source}" for source, n in ops.sources.most_common(8))


def graph_counts(engine: TalkerEngine) -> str:
    """What the runner captured: a chain or bucket that failed to capture runs eagerly."""
    fast = engine.runner.fast_path
    if fast is None:
        return "reference path (no graphs, no chains)"
    chains = engine.runner.chains
    mixed = fast.mixed
    return (f"decode graphs {len(fast.graphs._graphs)}/{len(fast.graphs.sizes)}, sampling "
            f"graphs {len(fast.graphs._sample_graphs)}, chain graphs "
            f"{chains.num_captured if chains else 0}/"
            f"{len(fast.graphs.sizes) * len(engine.runner.chain_lengths)}, mixed graphs "
            f"{mixed.num_captured if mixed else 0}/{len(mixed.buckets) if mixed else 0}"
            f"{' failed ' + str(mixed.failed) if mixed and mixed.failed else ''}")


def profile_batch(model: torch.nn.Module, batch: int, args: argparse.Namespace) -> None:
    engine = make_engine(model, batch, args)
    calls = RunnerCalls(engine)
    engine.runner._calls = calls  # type: ignore[attr-defined]
    run_once(engine, batch, "warm", None)
    calls.calls.clear()
    log: list[str] = []
    start = time.perf_counter()
    run_once(engine, batch, "timed", log)
    total = 1000 * (time.perf_counter() - start)
    print(f"\n== batch {batch}: {total:.1f} ms to {FRAMES} frames (ops counted: slower); "
          f"forwards {dict(calls.calls)}; {graph_counts(engine)}")
    print("\n".join(log))
    if not args.cprofile:
        return
    profiler = cProfile.Profile()
    profiler.enable()
    run_once(engine, batch, "prof", None)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats(args.sort)
    stats.print_stats(args.filter, args.rows)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", default="1,16", help="batch sizes, comma-separated")
    parser.add_argument("--tiny", action="store_true", help="tiny Talker dims (CPU smoke)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="auto", choices=("auto", "triton", "reference"))
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false",
                        help="skip the cProfile run (slow with interpreted kernels on CPU)")
    parser.add_argument("--sources", action="store_true",
                        help="also count each phase's ops by the line of our code that issued "
                        "them (slow: a stack walk per op)")
    parser.add_argument("--sort", default="tottime", help="cProfile sort key")
    parser.add_argument("--rows", type=int, default=25, help="cProfile rows to print")
    parser.add_argument("--filter", default="backends", help="cProfile rows matching this "
                        "(default: our code only, so interpreted kernels do not drown it)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.set_num_threads(1)
    OpCounter.sources_on = args.sources
    _count_interpreted_kernels()
    model = talker_model(args.tiny, device, dtype)
    model.dtype_ = dtype
    for batch in (int(b) for b in args.batch.split(",")):
        profile_batch(model, batch, args)


if __name__ == "__main__":
    main()
