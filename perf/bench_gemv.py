"""Skinny-GEMM benchmark on one GPU: F.linear (cuBLAS) vs `skinny_linear` (Triton) on the
Thinker's decode matmuls (Qwen3-8B: hidden 4096, 36 layers, q|k|v 6144, gate|up 24576, down
12288 -> 4096, LM head 151936), bf16, for 1, 2, 4, 8 and 16 rows.

Each timing is the median, over several replays, of a CUDA graph that runs the matmul once on
each of a rotating set of weight copies (at least 512 MB together, so no weight is still in L2),
divided by the number of calls: device time without host launch gaps, as in the graphed decode.
GB/s counts the weight bytes plus the activations read and the output written; "% copy" is
against a device-to-device copy measured in the same run (bytes read + written / time). The
per-step sum is 36 x (q|k|v + o + gate|up + down) + LM head.

`--sweep` first times every candidate config of the kernel per (shape, rows) and prints the
best of each as a `CONFIGS` table for backends/runner/triton_gemv.py; the comparison then uses
those winners. A config that fails to compile or run is reported and skipped.

`--model talker` takes the Talker's shapes (Llama, hidden 768, 20 layers, codec head 6562).

Usage: python perf/bench_gemv.py [--sweep] [--sweep-budget-s 400] [--rows 1,2,4,8,16] [--model talker]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.runner import triton_gemv  # noqa: E402
from backends.runner.triton_gemv import GemvConfig, row_bucket, triton_linear  # noqa: E402

MODELS = {  # model -> (layers, {name -> (N, K) of the [N, K] weight})
    "thinker": (36, {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096),
                     "down_proj": (4096, 12288), "lm_head": (151936, 4096)}),
    "talker": (20, {"qkv": (2304, 768), "o_proj": (768, 768), "gate_up": (6144, 768),
                    "down_proj": (768, 3072), "lm_head": (6562, 768)}),
}  # fmt: skip
LAYER_SHAPES = ("qkv", "o_proj", "gate_up", "down_proj")
ROTATE_BYTES = 512 << 20
REPEATS = 9
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def copy_bandwidth(num_bytes: int = 4 << 30) -> float:
    """Bytes/s of an eager device-to-device copy (as perf/bench_runner.py measures it), bytes
    read plus bytes written, after half a second of copies so the clocks have ramped up. (A
    copy captured in a graph becomes a copy-engine node, which is much slower.)"""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    start = time.monotonic()
    while time.monotonic() - start < 0.5:
        dst.copy_(src)
        torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / 10)
    del src, dst
    return 2 * num_bytes / (statistics.median(samples) * 1e-3)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    count = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
    return [torch.empty(n, k, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02)
            for _ in range(count)]  # fmt: skip


def graph_us(fn: Linear, x: torch.Tensor, weights: list[torch.Tensor], calls: int = 0) -> float:
    """Median device microseconds per call of fn(x, w), cycling over `weights` in one graph."""
    calls = calls or max(len(weights), 16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x, weights[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    graph.replay()
    samples = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(samples)


def moved_bytes(rows: int, n: int, k: int) -> int:
    return 2 * (n * k + rows * k + rows * n)


# (block_n, block_k, num_warps, num_stages) FMA tiles; (block_n, block_k, num_stages) dot tiles
FMA_TILES = tuple((bn, bk, w, st) for bn in (1, 2, 4, 8, 16) for bk in (512, 1024, 2048)
                  for w in (4, 8) for st in (1, 3) if 16 <= bn * bk // (32 * w) <= 64)  # fmt: skip
DOT_TILES = ((16, 128, 4), (16, 256, 4), (32, 128, 4), (32, 256, 3), (64, 128, 4),
             (64, 256, 3), (128, 64, 4), (128, 128, 3))  # fmt: skip


def candidates(rows: int, n: int, k: int) -> list[GemvConfig]:
    """The sweep's search space: FMA tiles for up to 8 rows, tensor-core tiles for all; each
    with split-K 1, 2, 4, 8 where K allows."""
    found = []
    if row_bucket(rows) <= 8:
        found += [GemvConfig(bn, bk, 1, w, st, False) for bn, bk, w, st in FMA_TILES]
    found += [GemvConfig(bn, bk, 1, 4, st, True) for bn, bk, st in DOT_TILES]
    return [_with_split(c, s) for c in found for s in (1, 2, 4, 8) if _split_ok(c, s, n, k)]


def _split_ok(cfg: GemvConfig, split: int, n: int, k: int) -> bool:
    return split == 1 or (k // split >= 2 * cfg.block_k and -(-n // cfg.block_n) * split <= 4096)


def _with_split(cfg: GemvConfig, split: int) -> GemvConfig:
    return GemvConfig(cfg.block_n, cfg.block_k, split, cfg.num_warps, cfg.num_stages, cfg.use_dot)


def sweep(rows_list: list[int], budget_s: float,
          shapes: dict[str, tuple[int, int]]) -> dict[tuple[int, int, int], GemvConfig | None]:  # fmt: skip
    """Time every candidate per (shape, rows); install and print the winners (None where
    cuBLAS beat every candidate)."""
    deadline, best = time.monotonic() + budget_s, {}
    for name, (n, k) in shapes.items():
        weights = weight_copies(n, k)
        for rows in rows_list:
            x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
            found = _sweep_one(x, weights, deadline)
            if found:
                (us, cfg), cublas_us = min(found, key=lambda f: f[0]), graph_us(F.linear, x, weights)
                best[(row_bucket(rows), n, k)] = cfg if us < cublas_us else None
                print(f"sweep {name} rows {rows}: best {us:.2f} us {cfg} ({len(found)} configs "
                      f"timed); cuBLAS {cublas_us:.2f} us", flush=True)  # fmt: skip
        del weights
        torch.cuda.empty_cache()
    triton_gemv.CONFIGS.update(best)
    print("\nCONFIGS = {")
    for key, cfg in sorted(best.items()):
        print(f"    {key}: {cfg!r},")
    print("}\n", flush=True)
    return best


def _sweep_one(
    x: torch.Tensor, weights: list[torch.Tensor], deadline: float
) -> list[tuple[float, GemvConfig]]:
    found = []
    for cfg in candidates(x.shape[0], *weights[0].shape):
        if time.monotonic() > deadline:
            print("sweep budget spent; remaining configs skipped", flush=True)
            break
        try:
            found.append((graph_us(_fixed(cfg), x, weights), cfg))
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  config {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    return found


def _fixed(cfg: GemvConfig) -> Linear:
    return lambda x, w: triton_linear(x, w, config=cfg)


def compare(rows_list: list[int], bandwidth: float, model: str) -> list[str]:
    """The markdown table (one row per shape and row count) and the per-step sums."""
    lines = [
        "| shape | N x K | rows | cuBLAS us | Triton us | cuBLAS % copy | Triton % copy "
        "| speedup | max rel err | config |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    times: dict[tuple[str, int], tuple[float, float]] = {}
    for name, (n, k) in MODELS[model][1].items():
        weights = weight_copies(n, k)
        for rows in rows_list:
            row, timing = _compare_one(name, rows, weights, bandwidth)
            lines.append(row)
            print(row, flush=True)
            times[(name, rows)] = timing
        del weights
        torch.cuda.empty_cache()
    return lines + [""] + step_sums(times, rows_list, bandwidth, model)


def _compare_one(
    name: str, rows: int, weights: list[torch.Tensor], bandwidth: float
) -> tuple[str, tuple[float, float]]:
    n, k = weights[0].shape
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    gbps = moved_bytes(rows, n, k) / 1e3
    cfg = triton_gemv.config_for(rows, n, k, x.device)
    label = "cuBLAS (table)" if triton_gemv.prefers_cublas(rows, n, k) else _short(cfg)
    timed = []
    for fn in (F.linear, triton_gemv.skinny_linear):
        try:
            timed.append(graph_us(fn, x, weights))
        except Exception:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            timed.append(float("nan"))
    err = _rel_error(x, weights[0])
    pct = [gbps / us * 1e9 / bandwidth * 100 for us in timed]
    row = (
        f"| {name} | {n} x {k} | {rows} | {timed[0]:.2f} | {timed[1]:.2f} | {pct[0]:.1f} "
        f"| {pct[1]:.1f} | {timed[0] / timed[1]:.2f} | {err:.1e} | {label} |"
    )
    return row, (timed[0], timed[1])


def _rel_error(x: torch.Tensor, w: torch.Tensor) -> float:
    try:
        ref = F.linear(x.float(), w.float())
        got = triton_gemv.skinny_linear(x, w).float()
        return float((got - ref).abs().max() / ref.abs().max())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return float("nan")


def _short(cfg: GemvConfig) -> str:
    kind = "dot" if cfg.use_dot else "fma"
    return (f"{kind} n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} "
            f"w{cfg.num_warps} st{cfg.num_stages}")  # fmt: skip


def step_sums(
    times: dict[tuple[str, int], tuple[float, float]], rows_list: list[int], bandwidth: float,
    model: str,
) -> list[str]:
    num_layers, shapes = MODELS[model]
    lines = [
        f"Per decode step: {num_layers} x (q|k|v + o + gate|up + down) + LM head.",
        "",
        "| rows | cuBLAS ms | Triton ms | floor ms (weights / copy BW) | cuBLAS / floor "
        "| Triton / floor |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rows in rows_list:
        per = [num_layers * sum(times[(s, rows)][i] for s in LAYER_SHAPES)
               + times[("lm_head", rows)][i] for i in (0, 1)]  # fmt: skip
        weight_bytes = 2 * (num_layers * sum(n * k for s in LAYER_SHAPES
                                             for n, k in [shapes[s]])
                            + shapes["lm_head"][0] * shapes["lm_head"][1])  # fmt: skip
        floor_ms = weight_bytes / bandwidth * 1e3
        lines.append(
            f"| {rows} | {per[0] / 1e3:.3f} | {per[1] / 1e3:.3f} | {floor_ms:.3f} "
            f"| {per[0] / 1e3 / floor_ms:.2f} | {per[1] / 1e3 / floor_ms:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="tune configs first")
    parser.add_argument("--sweep-budget-s", type=float, default=400.0)
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--model", choices=tuple(MODELS), default="thinker", help="whose shapes")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    head = [f"# Skinny GEMM on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
            f"copy bandwidth (read + write): {bandwidth / 1e12:.3f} TB/s", ""]  # fmt: skip
    print("\n".join(head), flush=True)
    if args.sweep:
        sweep(rows_list, args.sweep_budget_s, MODELS[args.model][1])
    text = "\n".join(head + compare(rows_list, bandwidth, args.model)) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
