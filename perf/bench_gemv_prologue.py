"""Where folding the norm / SwiGLU into the decode GEMV pays: fused vs unfused, per shape.

For the matmuls that follow an elementwise kernel in a decoder layer (q|k|v and gate|up after
RMSNorm + residual add, down after SwiGLU) at the Thinker's (Qwen3-8B) and the Talker's
(Llama, hidden 768) shapes, bf16, 1-16 rows, each timed as device microseconds per call in a
CUDA graph over rotating weight copies (perf/bench_gemv.py's method):

- unfused: the elementwise kernel (`triton_layer_ops`), then cuBLAS, and then the GEMV kernel
  with its table config (`triton_gemv.config_for`);
- fused: the GEMV kernel with the op as its prologue (`triton_gemv.Prologue`), with the table
  config and with the best of a few candidate tiles (a prologue re-reads the activation row in
  every program, so wider output tiles may win).

It prints a markdown table and a `PROLOGUE_CONFIGS` table for backends/runner/gemv_configs.py:
the best fused config where it beats both unfused variants, else None (leave it unfused).

Usage: python perf/bench_gemv_prologue.py [--rows 1,2,4,8,16] [--budget-s 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.runner.triton_gemv import (  # noqa: E402
    ADD_NORM,
    SILU_MUL,
    GemvConfig,
    Prologue,
    config_for,
    row_bucket,
    triton_linear,
)
from backends.runner.triton_layer_ops import rms_norm, silu_and_mul  # noqa: E402
from perf.bench_gemv import graph_us, weight_copies  # noqa: E402

SHAPES = {  # name -> (N, K, prologue)
    "thinker q|k|v": (6144, 4096, ADD_NORM),
    "thinker gate|up": (24576, 4096, ADD_NORM),
    "thinker down": (4096, 12288, SILU_MUL),
    "talker q|k|v": (2304, 768, ADD_NORM),
    "talker gate|up": (6144, 768, ADD_NORM),
    "talker down": (768, 3072, SILU_MUL),
}
FMA = [GemvConfig(bn, bk, 1, w, 1, False) for bn, bk, w in
       ((2, 1024, 4), (4, 1024, 4), (8, 512, 4), (8, 1024, 8), (16, 512, 8), (2, 2048, 4))]
DOT = [GemvConfig(bn, bk, 1, 4, st, True) for bn, bk, st in
       ((16, 128, 4), (32, 128, 4), (64, 128, 4), (64, 256, 3), (128, 128, 3))]  # fmt: skip
EPS = 1e-6


def candidates(rows: int, k: int, kind: int) -> list[GemvConfig]:
    found = FMA if row_bucket(rows) <= 2 else DOT
    if kind == SILU_MUL:  # no row-wide scale: split-K is allowed
        found = found + [replace(c, split_k=2) for c in found if k // 2 >= 2 * c.block_k]
    return [c for c in found if c.block_k <= k]


class Case:
    """One (shape, rows): its inputs and the three ways to compute it."""

    def __init__(self, n: int, k: int, kind: int, rows: int) -> None:
        self.kind, self.k = kind, k
        width = 2 * k if kind == SILU_MUL else k
        self.x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        self.residual = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        self.norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.empty_like(self.residual)
        self.weights = weight_copies(n, k)

    def unfused(self, linear) -> float:
        def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if self.kind == SILU_MUL:
                return linear(silu_and_mul(x), w)
            return linear(rms_norm(x, self.norm_w, EPS, residual=self.residual)[0], w)

        return graph_us(run, self.x, self.weights)

    def fused(self, cfg: GemvConfig) -> float:
        prologue = Prologue(SILU_MUL) if self.kind == SILU_MUL else Prologue(
            ADD_NORM, self.norm_w, EPS, self.residual, self.stream)  # fmt: skip
        return graph_us(lambda x, w: triton_linear(x, w, config=cfg, prologue=prologue),
                        self.x, self.weights)  # fmt: skip


def measure(name: str, rows: int, deadline: float) -> tuple[str, tuple, GemvConfig | None]:
    n, k, kind = SHAPES[name]
    case = Case(n, k, kind, rows)
    table_cfg = config_for(rows, n, k, torch.device("cuda"))
    cublas = case.unfused(F.linear)
    kernel = case.unfused(lambda x, w: triton_linear(x, w, config=table_cfg))
    fused_table = case.fused(table_cfg)
    best, best_cfg = fused_table, table_cfg
    for cfg in candidates(rows, k, kind):
        if time.monotonic() > deadline:
            break
        try:
            us = case.fused(cfg)
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile is skipped
            print(f"  skip {cfg}: {type(exc).__name__}", flush=True)
            continue
        if us < best:
            best, best_cfg = us, cfg
    wins = best < min(cublas, kernel)
    line = (f"| {name} | {rows} | {cublas:.1f} | {kernel:.1f} | {fused_table:.1f} | {best:.1f} "
            f"| {_short(best_cfg)} | {'fuse' if wins else 'keep unfused'} |")
    del case
    return line, (row_bucket(rows), n, k, kind), best_cfg if wins else None


def _short(cfg: GemvConfig) -> str:
    path = "dot" if cfg.use_dot else "fma"
    return f"{path} n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} st{cfg.num_stages}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop trying tiles after")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    deadline = time.monotonic() + args.budget_s
    lines = ["| matmul | rows | unfused, cuBLAS us | unfused, GEMV us | fused, table tile us "
             "| fused, best tile us | best tile | verdict |", "|" + " --- |" * 8]  # fmt: skip
    table = []
    for name in SHAPES:
        for rows in (int(r) for r in args.rows.split(",")):
            line, key, cfg = measure(name, rows, deadline)
            print(line, flush=True)
            lines.append(line)
            table.append(f"    {key}: {cfg!r},")
    text = "\n".join(lines + ["", "PROLOGUE_CONFIGS = {", *table, "}"]) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
