"""Where a steady Code2Wav window's time goes, without the profiler: host clocks and CUDA events
around each graphed part of `Token2Wav.decode` (encoder, CFM solve, HiFT).

    PYTHONPATH=$PWD python3 perf/window_timeline.py --batches 1,16 [--windows 8] [--idle-s 1] [--out t.md]

Per batch size, the median over the timed windows of: when the host entered and left each part,
when the device began and ended that part's work (CUDA events recorded as the part is entered and
left), and the window's wall time, all in ms from the window's start (its codes drawn, then
`decode`). A part whose device start comes well after the previous part's device end waited for
the host; the time before the encoder's device start is host work with nothing queued. The torch
profiler stretches host time 2-3x (cudaGraphLaunch most), which hides exactly this; CUDA events
and host clocks do not. Full dimensions with random weights, bf16 flow, pooled caches and CUDA
graphs, as served; `--tiny` on CPU shows the host columns only (tests). `--idle-s S`: each timed
window starts after the device and this thread idled S seconds, as one served stream's windows
(~1 s apart) do. A window costs ~0.3-0.4 ms more then, and the columns say where: on an H100 every
part took the same time on the GPU and the host reached the encoder's graph ~0.3 ms later
(perf/results/stages_h200.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav
from backends.models.token2wav.graphs import EncoderGraphs, HiFTGraphs, PooledSolverGraphs

PARTS = {"encoder": EncoderGraphs, "cfm": PooledSolverGraphs, "hift": HiFTGraphs}
WINDOW_CODES = 28  # 25 new codes and 3 of look-ahead: a steady window
WARMUP_WINDOWS = 8  # caches at their steady length, every graph captured


@dataclass(slots=True)
class Marks:
    """One window's marks: per part (host entry, host exit, device start event, device end event)."""

    host_start: float = 0.0
    start: torch.cuda.Event | None = None
    parts: dict[str, tuple[float, float, torch.cuda.Event | None, torch.cuda.Event | None]] = field(
        default_factory=dict)


def _event(cuda: bool) -> torch.cuda.Event | None:
    if not cuda:
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@contextmanager
def marked_parts(marks: list[Marks], cuda: bool) -> Iterator[None]:
    """Times every call of the three graphed parts into `marks[-1]` (class-level wrappers,
    removed on exit; a part called twice in a window, e.g. the HiFT for two mel lengths, keeps
    its last call: steady windows call each once)."""
    saved = {name: cls.__call__ for name, cls in PARTS.items()}

    def timed(name: str, call: Callable) -> Callable:
        def wrapper(self: object, *args: object) -> object:
            entry, begin = time.perf_counter(), _event(cuda)
            try:
                return call(self, *args)
            finally:
                marks[-1].parts[name] = (entry, time.perf_counter(), begin, _event(cuda))
        return wrapper

    for name, cls in PARTS.items():
        cls.__call__ = timed(name, saved[name])  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, cls in PARTS.items():
            cls.__call__ = saved[name]  # type: ignore[method-assign]


def build(tiny: bool, device: torch.device, batch: int) -> tuple[Token2Wav, list]:
    model = random_token2wav(Token2WavConfig.tiny() if tiny else Token2WavConfig(), seed=0).to(device)
    if device.type == "cuda":
        model.set_flow_dtype(torch.bfloat16)
    model.enable_cache_pool(batch)  # after the dtype: the pool is allocated in it
    audio = torch.from_numpy(synthesize_reference_voice(0)).float()
    voice = model.voice_from_audio(audio, REFERENCE_VOICE_SAMPLE_RATE)
    model.enable_cuda_graphs()  # after the voice's prompt pass, as served: window shapes only
    return model, [model.new_stream(voice) for _ in range(batch)]


def time_windows(model: Token2Wav, streams: list, windows: int, seed: int = 0,
                 idle_s: float = 0.0) -> list[dict[str, float]]:
    """Per timed window (each after `idle_s` seconds of idling): {column: ms from decode's start}."""
    cuda = model.device.type == "cuda"
    rng = np.random.default_rng(seed)

    def window() -> None:
        codes = rng.integers(0, 6561, (len(streams), WINDOW_CODES)).astype(np.int32)
        model.decode([StreamWindow(s, codes[b], False) for b, s in enumerate(streams)])

    for _ in range(WARMUP_WINDOWS):
        window()
    marks: list[Marks] = []
    rows = []
    with marked_parts(marks, cuda):
        for _ in range(windows):
            if cuda:
                torch.cuda.synchronize()
            time.sleep(idle_s)
            marks.append(Marks(time.perf_counter(), _event(cuda)))
            window()
            wall = time.perf_counter()
            end = _event(cuda)
            if end is not None:
                end.synchronize()
            rows.append(_columns(marks[-1], wall, end))
    return rows


def _columns(marks: Marks, wall: float, end: torch.cuda.Event | None) -> dict[str, float]:
    def host(t: float) -> float:
        return 1000.0 * (t - marks.host_start)

    row = {}
    for name, (entry, exit_, begin, done) in marks.parts.items():
        row[f"{name} host in"], row[f"{name} host out"] = host(entry), host(exit_)
        if marks.start is not None and begin is not None and done is not None:
            row[f"{name} device"] = marks.start.elapsed_time(begin)
            row[f"{name} device end"] = marks.start.elapsed_time(done)
    row["wall"] = host(wall)
    if marks.start is not None and end is not None:
        row["device end"] = marks.start.elapsed_time(end)
    return row


def report(batch: int, rows: list[dict[str, float]], idle_s: float = 0.0) -> list[str]:
    """Markdown: one line per column, the median and range over the windows."""
    idle = f", each after {idle_s:g} s idle" if idle_s else ""
    lines = [f"### batch {batch} ({len(rows)} windows{idle}, ms from the window's start)", "",
             "| column | median | min | max |", "|---|---:|---:|---:|"]
    for column in rows[0]:
        values = [row[column] for row in rows]
        lines.append(f"| {column} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--windows", type=int, default=8, help="timed windows per batch size")
    parser.add_argument("--tiny", action="store_true", help="the tiny model (CPU without CUDA)")
    parser.add_argument("--idle-s", default="0", help="comma list: idle seconds before each timed window")
    parser.add_argument("--out", default="", help="also write the tables to this markdown file")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = [f"# Code2Wav window timeline ({device.type}, {'tiny' if args.tiny else 'full dimensions'})", ""]
    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            model, streams = build(args.tiny, device, batch)
            for idle_s in (float(s) for s in args.idle_s.split(",")):
                lines += report(batch, time_windows(model, streams, args.windows, idle_s=idle_s), idle_s)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
