"""Where a batched Code2Wav window spends GPU time: torch.profiler over steady windows.

    PYTHONPATH=$PWD python3 perf/profile_code2wav.py --batch 16 [--graphs] [--pool] [--trace t.json]
    PYTHONPATH=$PWD python3 perf/profile_code2wav.py --hift-batches 1,16 [--cudnn-benchmark] [--no-tf32]

Eager (default) lists every kernel with its GPU time, so the sum shows whether the window is
bound by GPU work or by launches; `--graphs` profiles the served mode (graph replays).
`--hift-batches` instead times the HiFT alone on steady windows (58 mel frames, 3840 cached
source samples), eager and graphed, with HiFT's fused elementwise kernels (`snake_kernel`) on
and off (`--snake`), and the same plus the cross-fade, cache updates and host copy ("tail");
`--hift-profile` adds a kernel table per setting.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav
from backends.models.token2wav.graphs import HiFTGraphs
from backends.models.token2wav.stream import Token2WavStream, emit_rows, to_host

WINDOW_CODES = 28
HIFT_FRAMES = 58  # a steady window's HiFT input: 8 cached + 50 new mel frames
HELD = 3840  # cached source samples of a steady window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--rows", type=int, default=35)
    parser.add_argument("--pool", action="store_true")
    parser.add_argument("--hift-batches", default="", help="e.g. 1,16: time the HiFT alone")
    parser.add_argument("--snake", default="both", choices=("on", "off", "both"),
                        help="HiFT's fused elementwise kernels (with --hift-batches)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN time HiFT's conv algorithms (HiFTGenerator.cudnn_benchmark)")
    parser.add_argument("--hift-profile", action="store_true", help="kernel table per setting")
    parser.add_argument("--no-tf32", action="store_true",
                        help="cuDNN convs in full float32 (torch.backends.cudnn.allow_tf32 off)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--trace", default="",
                        help="also write the windows' Chrome trace here (perf/trace_gaps.py reads it)")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = not args.no_tf32
    model = random_token2wav(Token2WavConfig(), seed=0).to("cuda")
    model.hift.cudnn_benchmark = args.cudnn_benchmark
    if args.hift_batches:
        hift_report(model, args)
        return
    if args.graphs:
        model.enable_cuda_graphs()
    else:
        model.disable_cuda_graphs()
    model.set_flow_dtype(torch.bfloat16)
    if args.pool:  # the streams' DiT caches in one pooled tensor (no per-window cache copies)
        model.enable_cache_pool(args.batch)
    audio = torch.from_numpy(synthesize_reference_voice(0)).float()
    voice = model.voice_from_audio(audio, REFERENCE_VOICE_SAMPLE_RATE)
    streams = [model.new_stream(voice) for _ in range(args.batch)]
    rng = np.random.default_rng(0)

    def window() -> None:
        codes = rng.integers(0, 6561, (args.batch, WINDOW_CODES)).astype(np.int32)
        model.decode([StreamWindow(s, codes[b], False) for b, s in enumerate(streams)])

    for _ in range(6):
        window()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            window()
        torch.cuda.synchronize()
    print_table(prof, args.rows)
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"trace written to {args.trace}")


def print_table(prof: profile, rows: int) -> None:
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows,
                                    max_name_column_width=60))


def hift_report(model: Token2Wav, args: argparse.Namespace) -> None:
    """One line per (batch, snake, mode): HiFT ms and HiFT + emission + host copy ms."""
    snakes = {"on": [True], "off": [False], "both": [False, True]}[args.snake]
    print(f"HiFT alone, {HIFT_FRAMES} frames, median of {args.repeats}; cudnn.benchmark="
          f"{args.cudnn_benchmark}, cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    print("| batch | fused snake | mode | HiFT ms | HiFT + tail ms |")
    print("| ---: | --- | --- | ---: | ---: |")
    for batch in [int(b) for b in args.hift_batches.split(",")]:
        for fused in snakes:
            model.hift.fused = fused
            for mode in ("eager", "graphs"):
                vocode = HiFTGraphs(model.hift) if mode == "graphs" else model.hift
                hift_ms, tail_ms, prof = _time_hift(model, vocode, batch, args)
                print(f"| {batch} | {'on' if fused else 'off'} | {mode} | {hift_ms:.2f} | {tail_ms:.2f} |",
                      flush=True)
                if prof is not None:
                    print_table(prof, args.rows)
    model.hift.fused = None


@torch.inference_mode()
def _time_hift(model: Token2Wav, vocode: Callable[..., tuple[torch.Tensor, torch.Tensor]], batch: int,
               args: argparse.Namespace) -> tuple[float, float, profile | None]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    mel = torch.randn(batch, 80, HIFT_FRAMES, device="cuda", generator=gen) * 2 - 5
    noise = torch.randn(batch, HIFT_FRAMES * 480, model.hift.num_noise_channels(), device="cuda",
                        generator=gen)
    streams = [_steady_stream() for _ in range(batch)]

    def hift() -> tuple[torch.Tensor, torch.Tensor]:
        return vocode(mel, [s.source_cache for s in streams], noise)

    def tail() -> None:
        speech, source = hift()
        to_host(emit_rows(streams, mel, speech, source, [False] * batch, 8))

    times = [_median_ms(step, args.repeats) for step in (hift, tail)]
    prof = None
    if args.hift_profile:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                tail()
            torch.cuda.synchronize()
    return times[0], times[1], prof


def _steady_stream() -> Token2WavStream:
    """A stream in steady state for the HiFT: 8 cached mel frames, 3840-sample tails (no flow
    cache: the HiFT and emission never read it)."""
    return Token2WavStream(
        speaker=torch.zeros(192, device="cuda"), prompt_frames=0, flow_cache=None,  # type: ignore[arg-type]
        generator=torch.Generator(device="cuda"), mel_cache=torch.zeros(80, 8, device="cuda"),
        source_cache=torch.zeros(HELD, device="cuda"), speech_tail=torch.zeros(HELD, device="cuda"))


def _median_ms(step: Callable[[], object], repeats: int) -> float:
    for _ in range(5):  # compile Triton kernels, pick cuDNN algorithms, capture graphs
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


if __name__ == "__main__":
    main()
