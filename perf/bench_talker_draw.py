"""The Talker's per-step draw on one GPU: torch path vs the fused Triton kernel.

The torch path is what a chained Talker step ran before the kernel: `TalkerPolicyTable.apply`
-> `sample_on_device` (temperature 0.8, top-k 25, top-p 0.85) -> `update`, through
`SamplingStates.sample`; the fused path is `FusedSamplingStates.sample` (one kernel). Both draw
over the real vocabulary (6562 codes) for rows whose policy is on (a turn-end chunk, a full
penalty window), K=8 draws captured in one CUDA graph as in a decode chain; each timing is
the median over replays of that graph divided by K: device time per draw without launch gaps.
A first eager step checks that both paths draw the same tokens.

Usage: python perf/bench_talker_draw.py [--batches 1,16] [--num-warps 4,8,16] [--replays 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.models.talker_policy import (  # noqa: E402
    CHUNK_BUDGETS,
    CODEC_EOS,
    ChunkKind,
    TalkerSamplingConfig,
)
from backends.runner.fused_draw import FusedSamplingStates  # noqa: E402
from backends.runner.sampling_states import SamplingStates  # noqa: E402
from backends.talker import draw_kernel  # noqa: E402
from backends.talker.policy_table import TalkerPolicyTable  # noqa: E402

CHAIN = 8


def make_states(batch: int, fused: bool) -> SamplingStates:
    """`batch` Talker slots, policy on in a turn-end chunk, penalty windows full."""
    sampling = TalkerSamplingConfig()
    table = TalkerPolicyTable(batch, "cuda", sampling, CODEC_EOS)
    states: SamplingStates = SamplingStates(batch, "cuda", table)
    if fused:
        assert table.fused_draw is not None
        states = FusedSamplingStates(batch, "cuda", table, table.fused_draw)
    params = sampling.to_sampling_params()
    for slot in range(batch):
        states.set(slot, dataclasses.replace(params, seed=slot))
        table.open(slot)
        table.begin_chunk(slot, CHUNK_BUDGETS[ChunkKind.TURN_END])
    table.table[:batch, 8:] = torch.randint(0, 64, (batch, table.window), device="cuda")
    return states


def chain_us(states: SamplingStates, logits: torch.Tensor, replays: int) -> float:
    """Median device microseconds per draw of a captured chain of CHAIN draws."""
    slots = torch.arange(logits.shape[0], device="cuda")
    positions = torch.full_like(slots, 100)

    def chain() -> torch.Tensor:
        return torch.stack([states.sample(logits, slots, positions + k) for k in range(CHAIN)])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain()  # warm-up (compiles the kernel) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / CHAIN)
    return statistics.median(times)


def check_tokens(batch: int, logits: torch.Tensor) -> bool:
    reference, fused = make_states(batch, False), make_states(batch, True)
    fused.processor.table.copy_(reference.processor.table)  # type: ignore[union-attr]
    slots = torch.arange(batch, device="cuda")
    positions = torch.full_like(slots, 7)
    expected = reference.sample(logits.clone(), slots, positions)
    return bool(torch.equal(expected, fused.sample(logits.clone(), slots, positions)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--num-warps", default="8", help="kernel warps to try, e.g. 4,8,16")
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs CUDA")
    torch.manual_seed(0)
    print(f"{'batch':>5} {'path':>14} {'us/draw':>9} {'same tokens':>12}")
    for batch in (int(b) for b in args.batches.split(",")):
        logits = torch.randn(batch, CODEC_EOS + 1, device="cuda") * 2.0
        logits[:, :64] += 3.0  # a few favoured codes, as the Talker's
        same = check_tokens(batch, logits)
        torch_us = chain_us(make_states(batch, False), logits, args.replays)
        print(f"{batch:>5} {'torch':>14} {torch_us:>9.1f} {'':>12}")
        for warps in (int(w) for w in args.num_warps.split(",")):
            draw_kernel._NUM_WARPS = warps
            fused_us = chain_us(make_states(batch, True), logits, args.replays)
            print(f"{batch:>5} {f'fused w{warps}':>14} {fused_us:>9.1f} {str(same):>12}")


if __name__ == "__main__":
    main()
