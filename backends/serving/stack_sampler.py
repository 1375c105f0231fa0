"""A statistical profiler of one stub process's Python threads, for serving-time profiles.

With `DUPLEX_STACK_SAMPLES_DIR` set, each stage (and the duplex orchestrator) samples every
thread's Python stack every few milliseconds and writes the counts as collapsed stacks
(`thread;file:function;...;file:function count`, the flame-graph input format) to
`<dir>/<name>-<pid>.folded`, rewritten every few seconds so a killed server still leaves its
profile. It answers what in-process benchmarks cannot: where a stage's engine thread spends
its wall time under real serving load (host work, waits on the GPU, the GIL, the queue).
A C call shows as the Python line that made it (a `synchronize` wait is that line's frame).
`perf/stack_report.py` prints the top frames per thread. Off unless the variable is set.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType

ENV_DIR = "DUPLEX_STACK_SAMPLES_DIR"
MAX_DEPTH = 40  # frames kept from the leaf up: enough to reach the engine's step


def collapse(frame: FrameType | None, thread_name: str) -> str:
    """One stack as `thread;outer;...;leaf` with `file:function` frames (no line numbers:
    a function's samples add up, whatever line it was on)."""
    names: list[str] = []
    while frame is not None and len(names) < MAX_DEPTH:
        code = frame.f_code
        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back
    return ";".join([thread_name, *reversed(names)])


class StackSampler:
    """Samples all threads but its own every `interval_s`; `stop()` writes the last counts."""

    def __init__(self, path: Path, interval_s: float = 0.005, flush_s: float = 5.0) -> None:
        self.path = path
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.counts: Counter[str] = Counter()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()

    def sample_once(self) -> None:
        """Count every thread's current stack once (the caller's and the sampler's own aside)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        skip = {threading.get_ident(), self._thread.ident}
        for ident, frame in sys._current_frames().items():
            if ident not in skip:
                self.counts[collapse(frame, names.get(ident, f"thread-{ident}"))] += 1

    def write(self) -> None:
        lines = [f"{stack} {count}" for stack, count in self.counts.most_common()]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.path)  # a reader never sees a half-written profile

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(1.0)
        self.write()

    def _run(self) -> None:
        last_flush = time.monotonic()
        while not self._stopped.wait(self.interval_s):
            self.sample_once()
            if time.monotonic() - last_flush >= self.flush_s:
                self.write()
                last_flush = time.monotonic()


def start_stack_sampler(name: str, environ: dict[str, str] | None = None) -> StackSampler | None:
    """A sampler for this process if `DUPLEX_STACK_SAMPLES_DIR` is set, else None."""
    directory = (os.environ if environ is None else environ).get(ENV_DIR, "")
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return StackSampler(Path(directory) / f"{name}-{os.getpid()}.folded")
