"""One Thinker text-token draw as the duplex policy does it, on a host logits row.

The policy's `_sample` on a [151936] float32 row: -inf on the special and bad ids, the
repetition penalty over the last 512 generated tokens, then temperature / top-k / top-p and
the keyed Gumbel draw (`host_draws.filtered_draw`). The runner samples hooked rows this way one
after another, so a batch-16 Thinker step pays it 16 times. Prints the mean ms per draw, and
its parts: the masks and the penalty, the top-k pass alone. On CUDA also the draw with the
row's device-to-host copy first (what the runner does before a hook runs).

    python3 perf/bench_policy_draw.py [--rows 200] [--history 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.runner.host_draws import filtered_draw  # noqa: E402
from backends.runner.sampler import apply_repetition_penalty, step_seed  # noqa: E402

VOCAB = 151936
SPECIAL = [*range(151643, 151700), *range(151700, 151936, 7)]  # a few runs and scattered ids
BAD = [151704, 151705]


def mask_and_penalise(row: torch.Tensor, history: list[int]) -> None:
    row[SPECIAL] = float("-inf")
    row[BAD] = float("-inf")
    apply_repetition_penalty(row, history, 1.05, 512)


def draw(row: torch.Tensor, history: list[int], seed: int) -> int:
    """The policy's text draw on `row` (changed in place)."""
    mask_and_penalise(row, history)
    return filtered_draw(row, 0.7, 20, 0.8, step_seed(seed, len(history)))


def mean_ms(rows: list[torch.Tensor], work: Callable[[torch.Tensor, int], object]) -> float:
    """Mean ms of `work(fresh clone of a row, its index)` over the rows (clones not timed)."""
    total = 0.0
    for i, row in enumerate(rows):
        fresh = row.clone()
        start = time.perf_counter()
        work(fresh, i)
        total += time.perf_counter() - start
    return 1e3 * total / len(rows)


def copied_draw(source: torch.Tensor, history: list[int], seed: int) -> int:
    host = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
    host.copy_(source, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    return draw(host, history, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--history", type=int, default=300, help="generated tokens so far")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the stage processes run
    gen = torch.Generator().manual_seed(0)
    rows = [4 * torch.randn(VOCAB, generator=gen) for _ in range(args.rows)]
    hist = torch.randint(0, 150000, (args.history,), generator=gen).tolist()
    for _ in range(2):  # warm-up
        mean_ms(rows[:20], lambda row, i: draw(row, hist, i))
    print("| part | ms per row |\n|---|---|")
    print(f"| whole draw | {mean_ms(rows, lambda row, i: draw(row, hist, i)):.3f} |")
    print(f"| masks + penalty | {mean_ms(rows, lambda row, i: mask_and_penalise(row, hist)):.3f} |")
    print(f"| top-k pass (torch.topk k=21) | {mean_ms(rows, lambda row, i: torch.topk(row, 21)):.3f} |")
    if torch.cuda.is_available():
        on_gpu = [row.cuda() for row in rows]
        mean_ms(on_gpu[:20], lambda row, i: copied_draw(row, hist, i))
        copied = mean_ms(on_gpu, lambda row, i: copied_draw(row, hist, i))
        print(f"| whole draw after the row's device-to-host copy | {copied:.3f} |")


if __name__ == "__main__":
    main()
