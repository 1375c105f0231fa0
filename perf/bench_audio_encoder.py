"""The streaming audio encoder's graphed chunk pass as served: keys bucketed to what sessions
hold, on CUDA the attention through the split-key Triton kernel
(backends/models/chunk_attention_kernel.py); q, k, v as three GEMMs vs one (packed, served).

Whisper-medium sizes (24 layers, d_model 1024, table 1500), random weights, bf16 on CUDA. Each
case is one `ChunkEncoderGraphs.encode` call of `rows` sessions that each hold `held` frames
(a unit adds 50): staging their held keys into the working cache, the replay, the copy back.
It prints the median and P90 wall ms of a call (synchronised: what the Thinker's thread waits
for before the append's step) for each arm, each arm's ratio to the first, the seconds
`capture_all` took and how many graphs it holds, and the peak GPU memory.

    python3 perf/bench_audio_encoder.py [--rows 1,2,4] [--held 0,100,250,500,1000,1400]
                                        [--repeats 50] [--tiny] [--profile]

--profile: also the CUDA kernels of one session's packed calls at 100 held frames
(torch.profiler, by device time), and how many kernels a call launches.

--tiny runs a 2-layer tower (for a CPU smoke run; the CPU runs the same static-buffer pass
eagerly, so its numbers say nothing about the GPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.audio.encoder_graphs import ChunkEncoderGraphs  # noqa: E402
from backends.audio.encoder_model import AudioEncoderModel  # noqa: E402
from backends.audio.streaming_encoder import StreamingAudioConfig  # noqa: E402
from backends.checkpoint.full_random import WHISPER_MEDIUM  # noqa: E402
from backends.models.encoder_kv import EncoderKVCache  # noqa: E402
from backends.models.whisper_encoder import WhisperEncoderConfig  # noqa: E402

LLM_HIDDEN = 4096
TINY = {**WHISPER_MEDIUM, "d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
        "encoder_ffn_dim": 256}
ARMS = (("three q/k/v GEMMs", False), ("packed q/k/v", True))  # name, q/k/v packed


def _model(tiny: bool, device: torch.device) -> AudioEncoderModel:
    config = WhisperEncoderConfig.from_dict(TINY if tiny else WHISPER_MEDIUM)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    return AudioEncoderModel.from_config(config, LLM_HIDDEN if not tiny else 128, dtype=dtype,
                                         device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_case(graphs: ChunkEncoderGraphs, rows: int, held: int, repeats: int) -> list[float]:
    """Wall ms of `repeats` encode calls of `rows` sessions holding `held` frames each."""
    model = graphs.model
    weight = model.apm.conv1.weight
    caches = [EncoderKVCache.allocate(model.apm.config, weight.dtype, weight.device)
              for _ in range(rows)]
    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    hidden = torch.randn(rows, graphs.num_frames, model.apm.config.d_model, dtype=weight.dtype,
                         device=weight.device)
    times = []
    for _ in range(repeats + 2):  # the first two are not timed
        for cache in caches:
            cache.length = held
        _sync(weight.device)
        started = time.perf_counter()
        graphs.encode(hidden, caches)
        _sync(weight.device)
        times.append((time.perf_counter() - started) * 1e3)
    return times[2:]


def _arm(model: AudioEncoderModel, packed: bool,
         args: argparse.Namespace) -> tuple[dict[tuple[int, int], list[float]], str]:
    frames = StreamingAudioConfig().frames_per_unit
    model.apm.pack_projections(packed)  # before the captures: a graph keeps the path it recorded
    graphs = ChunkEncoderGraphs(model, frames, max_rows=max(args.rows))
    started = time.perf_counter()
    count = graphs.capture_all()
    note = f"capture_all {time.perf_counter() - started:.2f} s, {count} graphs"
    table = model.apm.config.max_source_positions
    cases = {(rows, held): time_case(graphs, rows, held, args.repeats)
             for rows in args.rows for held in args.held if held + frames < table}
    return cases, note


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=_ints, default=[1, 2, 4])
    parser.add_argument("--held", type=_ints, default=[0, 100, 250, 500, 1000, 1400])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _model(args.tiny, device)
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
          f"{'tiny' if args.tiny else 'whisper-medium'} tower, {args.repeats} calls a case")
    results = {}
    for name, packed in ARMS:
        results[name], note = _arm(model, packed, args)
        print(f"{name}: {note}")
    _table(results)
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    if args.profile:
        _profile(model, args)


def _table(results: dict[str, dict[tuple[int, int], list[float]]]) -> None:
    names = list(results)
    print("| rows | held frames | " + " | ".join(f"{name} median / P90 ms" for name in names)
          + " | " + " | ".join(f"{name} / {names[0]}" for name in names[1:]) + " |")
    print("|---" * (2 + 2 * len(names) - 1) + "|")
    for case, base in results[names[0]].items():
        arms = [results[name][case] for name in names]
        times = [f"{np.median(t):.3f} / {np.percentile(t, 90):.3f}" for t in arms]
        ratios = [f"{np.median(t) / np.median(base):.2f}" for t in arms[1:]]
        print(f"| {case[0]} | {case[1]} | " + " | ".join(times + ratios) + " |")


def _profile(model: AudioEncoderModel, args: argparse.Namespace, calls: int = 20) -> None:
    model.apm.pack_projections()
    graphs = ChunkEncoderGraphs(model, StreamingAudioConfig().frames_per_unit, max_rows=1)
    graphs.capture_all()
    time_case(graphs, 1, 100, 2)  # staged shapes warm
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        time_case(graphs, 1, 100, calls - 2)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_ms = sum(e.device_time for e in kernels) / calls / 1e3
    print(f"\nprofile: {calls} calls of 1 session at 100 held frames, {len(kernels) / calls:.0f} "
          f"kernels and {device_ms:.3f} ms of device time a call")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25,
                                    max_name_column_width=80))


if __name__ == "__main__":
    main()
