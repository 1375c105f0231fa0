"""Where a batched Code2Wav window spends GPU time: torch.profiler over steady windows.

    PYTHONPATH=$PWD python3 perf/profile_code2wav.py --batch 16 [--graphs] [--pool]

Eager (default) lists every kernel with its GPU time, so the sum shows whether the window is
bound by GPU work or by launches; `--graphs` profiles the served mode (graph replays).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice
from backends.models.token2wav import StreamWindow, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav

WINDOW_CODES = 28


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--rows", type=int, default=35)
    parser.add_argument("--pool", action="store_true")
    args = parser.parse_args()
    model = random_token2wav(Token2WavConfig(), seed=0).to("cuda")
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
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows,
                                      max_name_column_width=60)
    print(table)


if __name__ == "__main__":
    main()
