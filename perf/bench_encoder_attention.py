"""The audio encoder's chunk attention alone, per key bucket: which kernel to give long keys.

A unit's chunk is 50 query frames against a session's held frames plus the chunk, padded to a
key bucket (backends/audio/encoder_graphs.py) and masked past each row's end. Whisper-medium
heads (16 x 64), bf16, on CUDA. Three ways to attend:
- `efficient`: `scaled_dot_product_attention` as the encoder calls it (a bool mask rules out
  flash, so the memory-efficient kernel runs: one program per head and 64-query block, each
  walking every key);
- `math`: the same call restricted to the math backend;
- `explicit bf16`: scores by one batched bf16 GEMM, a masked float32 softmax, one more GEMM;
- `explicit fp32`: the same in float32 throughout, the probabilities and values too (tried as
  the attention of a one-session graph at >= 1024 keys; not kept).
Each time is the median device microseconds per call over replays of a CUDA graph of 24 calls
(a pass's layers), `bench_gemv.graph_us`; the outputs are checked against `efficient`.

    python3 perf/bench_encoder_attention.py [--rows 1,4] [--keys 64,128,256,512,1024,1500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf import bench_gemv  # noqa: E402

HEADS, HEAD_DIM, QUERIES, LAYERS = 16, 64, 50, 24


def efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def explicit_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1, dtype=torch.float32)
    return probs.to(v.dtype) @ v


def case(rows: int, keys: int) -> tuple[torch.Tensor, ...]:
    """q [rows, heads, 50, 64], k / v [rows, heads, keys, 64] (strided as the working cache's
    layer slices are), mask [rows, 1, 1, keys]: row r holds keys - 10 r frames."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(rows, HEADS, QUERIES, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    cache = torch.randn(2, rows, LAYERS, HEADS, 1500, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
    k, v = cache[0, :, 0, :, :keys], cache[1, :, 0, :, :keys]
    ends = torch.tensor([max(QUERIES, keys - 10 * r) for r in range(rows)], device="cuda")
    mask = (torch.arange(keys, device="cuda")[None, :] < ends[:, None])[:, None, None, :]
    return q, k, v, mask


def explicit_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return (probs @ v.float()).to(v.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--keys", default="64,128,256,512,1024,1500")
    args = parser.parse_args()
    kernels = {"efficient": efficient, "math": math, "explicit bf16": explicit_bf16,
               "explicit fp32": explicit_fp32}
    print(f"device {torch.cuda.get_device_name()}; us per call (graph of {LAYERS} calls), "
          f"max |difference| against efficient")
    print("| rows | keys | " + " | ".join(kernels) + " |\n|---|---|" + "---|" * len(kernels))
    for rows in (int(r) for r in args.rows.split(",")):
        for keys in (int(k) for k in args.keys.split(",")):
            q, k, v, mask = case(rows, keys)
            want = efficient(q, k, v, mask)
            cells = []
            for fn in kernels.values():
                us = bench_gemv.graph_us(lambda x, _w, fn=fn: fn(x, k, v, mask), q, [q], calls=LAYERS)
                error = (fn(q, k, v, mask).float() - want.float()).abs().max().item()
                cells.append(f"{us:.1f} ({error:.0e})")
            print(f"| {rows} | {keys} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
