"""Code2Wav's cache-pool write after a window (`EstimatorPool.commit`): the Triton copy kernel
(`pool_scatter_kernel`, the fused path) against torch's indexed assignment, on CUDA.

    PYTHONPATH=$PWD python3 perf/bench_pool_commit.py [--batches 1,4,16] [--repeats 12]

Full-size pool in bfloat16, each stream keeping 50 new frames of a 56-frame window (a steady
window); CUDA events around `commit`, so its host work (the cut, the index upload) counts too.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from backends.models.token2wav import Token2WavConfig
from backends.models.token2wav.assets import random_token2wav

NEW_FRAMES, KEPT_FRAMES, CACHED_FRAMES, PROMPT_FRAMES = 56, 50, 200, 100


def commit_us(model, batch: int, fused: bool | None, repeats: int) -> float:
    """Median us of one commit; fused None = the served choice (the kernel on CUDA)."""
    model.flow.decoder.estimator.fused = fused
    pool = model.cache_pool
    steps, depth, _, heads, _, width = pool.att.shape
    like = dict(device="cuda", dtype=pool.att.dtype)
    first = torch.zeros(steps, depth, 2, heads, CACHED_FRAMES, width, **like)
    slots = [pool.acquire(first, PROMPT_FRAMES) for _ in range(batch)]
    new_kv = torch.randn(steps, depth, 2 * batch, heads, NEW_FRAMES, width, **like)
    times = []
    try:
        for _ in range(repeats + 2):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            pool.commit(new_kv, [KEPT_FRAMES] * batch, slots)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000)
    finally:
        for slot in slots:
            pool.release(slot)
    return float(np.median(times[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = random_token2wav(Token2WavConfig(), seed=0).to("cuda")
    model.set_flow_dtype(torch.bfloat16)
    model.enable_cache_pool(max(batches))
    print("| streams | torch indexing us | kernel us | ratio |\n| ---: | ---: | ---: | ---: |")
    for batch in batches:
        torch_us = commit_us(model, batch, False, args.repeats)
        kernel_us = commit_us(model, batch, None, args.repeats)
        print(f"| {batch} | {torch_us:.0f} | {kernel_us:.0f} | {kernel_us / torch_us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
