"""Paged decode attention on one GPU: key tiles of 64 vs 128 at the launcher's split counts.

For the Thinker's heads (Qwen3-8B: 32 over 8 kv heads, head dim 128) and the Talker's (Llama:
12 over 12, head dim 64), bf16, page size 16, batches of single-token decodes, it times
`paged_attention_triton` (attention + merge) with `tile=64` and `tile=128`, each at the split
count the launcher would pick for that tile (`num_kv_splits`), and marks the tile the launcher
picks (`_launch_shape`'s wide flag). A case has a host bound (what a captured graph's metadata
holds: the runner's max length) and a real length (what the device reads), as in serving.

Each time is the median over replays of a CUDA graph of 36 launches (a Thinker step's layers),
in device microseconds per launch (`bench_gemv.graph_us`); one KV pool per case, bigger than what 36 launches read, is
not rotated (a layer's KV is read once per step, so L2 holds little of it either way).

Usage: python perf/bench_attention.py [--batches 1,2,4,8,16,32] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.runner import triton_paged_attention as tpa  # noqa: E402
from backends.runner.attention import AttentionMetadata  # noqa: E402
from perf import bench_gemv  # noqa: E402

PAGE = 16
LAUNCHES = 36
HEADS = {"thinker": (32, 8, 128), "talker": (12, 12, 64)}  # heads, kv heads, head dim
# (host bound, real keys): graphs hold the runner's max length, the device reads the real one
LENGTHS = {
    "thinker": ((1024, 1024), (4096, 4096), (4096, 256), (4096, 1024), (8192, 1024), (8192, 4096)),
    "talker": ((256, 256), (1024, 1024), (4096, 4096), (4096, 256), (4096, 1024)),
}


def decode_case(num_reqs: int, real: int, bound: int, heads: tuple[int, int, int]):
    """(query, key pages, value pages, metadata): `num_reqs` decodes at `real` keys each."""
    num_heads, kv_heads, dim = heads
    gen = torch.Generator().manual_seed(1)
    pages = -(-bound // PAGE)
    num_blocks = num_reqs * pages + 2
    order = torch.randperm(num_blocks, generator=gen)[: num_reqs * pages]
    cache = torch.randn(2, num_blocks, PAGE, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    starts = np.arange(num_reqs + 1, dtype=np.int32)

    def lens(value: int) -> torch.Tensor:
        return torch.full((num_reqs,), value, dtype=torch.int32, device="cuda")

    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(starts).cuda(), seq_lens=lens(real),
        context_lens=lens(real - 1),
        block_tables=order.view(num_reqs, pages).to(torch.int32).cuda(),
        slot_mapping=torch.zeros(num_reqs, dtype=torch.int64, device="cuda"),
        query_start_loc_np=starts, seq_lens_np=np.full(num_reqs, bound, np.int32),
        block_size=PAGE, backend="triton",
    )  # fmt: skip
    query = torch.randn(num_reqs, num_heads, dim, dtype=torch.bfloat16, device="cuda")
    return query, cache[0], cache[1], meta


def graph_us(launch: Callable[[], object]) -> float:
    """Median device us per launch over a graph of LAUNCHES launches (bench_gemv's method)."""
    return bench_gemv.graph_us(lambda _x, _w: launch(), None, [None], calls=LAUNCHES)


def bench_case(model: str, batch: int, bound: int, real: int, num_sms: int) -> str:
    heads = HEADS[model]
    query, k_cache, v_cache, meta = decode_case(batch, real, bound, heads)
    programs = batch * heads[1]
    group_pad = triton.next_power_of_2(heads[0] // heads[1])
    wide = tpa._launch_shape(meta, group_pad, heads[1], query.device)[3]
    cells = []
    for tile in (tpa.TILE_N, tpa.WIDE_TILE_N):
        splits = tpa.num_kv_splits(programs, bound, num_sms, tile)
        us = graph_us(lambda: tpa.paged_attention_triton(query, k_cache, v_cache, meta, 0.1,
                                                         splits=splits, tile=tile))  # fmt: skip
        cells.append((splits, us))
    (s64, us64), (s128, us128) = cells
    picked = "128" if wide else "64"
    return (f"| {model} | {batch} | {bound} | {real} | {programs} | {s64} | {us64:.2f} | {s128} "
            f"| {us128:.2f} | {us128 / us64:.3f} | {picked} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines = [f"device: {torch.cuda.get_device_name(0)}, {num_sms} SMs; us per launch",
             "", "| model | batch | bound | real | programs | splits64 | us64 | splits128 "
             "| us128 | 128/64 | launcher picks |", "|" + " --- |" * 11]  # fmt: skip
    print("\n".join(lines), flush=True)
    for model in HEADS:
        for batch in map(int, args.batches.split(",")):
            for bound, real in LENGTHS[model]:
                lines.append(bench_case(model, batch, bound, real, num_sms))
                print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
