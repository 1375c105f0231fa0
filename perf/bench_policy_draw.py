"""One Thinker text-token draw as the duplex policy does it, on a host logits row.

The policy's `_sample` on a [151936] float32 row: -inf on the special and bad ids, the
repetition penalty over the last 512 generated tokens, then temperature / top-k / top-p and
the keyed Gumbel draw (`host_draws.filtered_draw`). The runner samples hooked rows this way one
after another, so a batch-16 Thinker step pays it 16 times. Prints the mean ms per draw, and
its parts: the masks and the penalty, the top-k pass alone. On CUDA also the draw with the
row's device-to-host copy first (what the runner does before a hook runs). Then the policy's
own text draw (`policy_rows`) on the whole row with the runner's raw top candidates, as a hook
gets a row that goes whole on CUDA (under a runner penalty), against the same draw from the
row's summary (`host_rows.CompactRow`: what the host gets on CUDA, without the row's copy), a
step's 16 summary draws one after another against together (`host_draws.run_together`), and
what handing a step's 16 summaries to their draws costs per row (`HostRows.row`).

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

from backends.checkpoint.tokenizer import SpecialTokens  # noqa: E402
from backends.runner.host_draws import (  # noqa: E402
    TOP_CANDIDATES,
    DrawRequest,
    DrawSteps,
    TopCandidates,
    filtered_draw,
    run_alone,
    run_together,
)
from backends.runner.host_rows import HostRows  # noqa: E402
from backends.runner.sampler import apply_repetition_penalty, step_seed  # noqa: E402
from backends.thinker.policy_masks import PolicyIds  # noqa: E402
from backends.thinker.policy_rows import PolicyRow, SummaryRow, WholeRow  # noqa: E402
from backends.thinker.recent_tokens import RecentTokens  # noqa: E402

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


TOKENIZER_IDS = 151669  # ids past it: embedding padding, the policy's bad ids
POLICY_IDS = PolicyIds(SpecialTokens(*range(151643, 151658)), range(TOKENIZER_IDS, VOCAB))


def policy_draw(row: PolicyRow, history: RecentTokens, seed: int, knob: bool) -> int:
    return run_alone(policy_steps(row, history, seed, knob))


def policy_steps(row: PolicyRow, history: RecentTokens, seed: int, knob: bool) -> DrawSteps:
    """The duplex policy's text draw: the knob's reply token (`DuplexPolicy._reply_token`, no
    boundary draw) or the real weights' (rule 4's boundary draw on the raw row first), then
    rule 5 (`DuplexPolicy._sample`), its last part yielded where the row leaves it."""
    key = step_seed(seed, len(history))
    if knob:
        row.mask("special_ids")
    elif row.boundary_hit(POLICY_IDS.chunk_eos_ids[0], False, key):
        return POLICY_IDS.chunk_eos_ids[0]
    else:
        row.mask("chunk_eos_ids")
    row.mask("bad_ids")
    row.penalise(history, 1.05)
    drawn = row.draw(0.7, 20, 0.8, key, lowered=True)
    return (yield drawn) if isinstance(drawn, DrawRequest) else drawn


def policy_draws(rows: list[torch.Tensor], history: list[int], knob: bool) -> tuple[float, float]:
    """Mean ms of the policy's draw per row: whole row with candidates, then its summary."""
    whole_rows, summaries = [], []
    for row in rows:
        top = torch.topk(row[:TOKENIZER_IDS], TOP_CANDIDATES)
        whole_rows.append(TopCandidates(top.values.numpy(), top.indices.numpy(), TOKENIZER_IDS))
        host_rows = HostRows(row[None], [True], TOKENIZER_IDS, POLICY_IDS.chunk_eos_ids,
                             with_candidates=False)
        summaries.append(host_rows.row(0, {k: v.clone() for k, v in host_rows.outputs.items()}))
    drawn: list[list[int]] = [[], []]
    recent = RecentTokens(512)
    recent.extend(history)

    def whole(row: torch.Tensor, i: int) -> None:
        drawn[0].append(policy_draw(WholeRow(row, POLICY_IDS, whole_rows[i]), recent, i, knob))

    def summary(_: torch.Tensor, i: int) -> None:
        drawn[1].append(policy_draw(SummaryRow(summaries[i], POLICY_IDS), recent, i, knob))

    whole_ms, summary_ms = mean_ms(rows, whole), mean_ms(rows, summary)
    assert drawn[0] == drawn[1], "the summary must draw the whole row's tokens"
    return whole_ms, summary_ms


def step_draws_ms(rows: list[torch.Tensor], history: list[int], knob: bool,
                  batch: int = 16) -> tuple[float, float]:
    """Mean ms per row of a step's `batch` summary draws: one after another (`run_alone`, as
    the runner did), and together (`run_together`, as `FastPath._finish` does now)."""
    recent = RecentTokens(512)
    recent.extend(history)
    times = [0.0, 0.0]
    count = 0
    for start in range(0, len(rows) - batch + 1, batch):
        host_rows = HostRows(torch.stack(rows[start : start + batch]), [True] * batch,
                             TOKENIZER_IDS, POLICY_IDS.chunk_eos_ids, with_candidates=False)
        host = {k: v.clone() for k, v in host_rows.outputs.items()}
        summaries = [host_rows.row(k, host) for k in range(batch)]
        drawn = []
        for form, run in enumerate((lambda s: [run_alone(x) for x in s], run_together)):
            begin = time.perf_counter()
            drawn.append(run([policy_steps(SummaryRow(summary, POLICY_IDS), recent, start + k, knob)
                              for k, summary in enumerate(summaries)]))
            times[form] += time.perf_counter() - begin
        assert drawn[0] == drawn[1], "drawn together, the rows must draw their tokens alone"
        count += batch
    return 1e3 * times[0] / count, 1e3 * times[1] / count


def summaries_ms(rows: list[torch.Tensor], batch: int = 16) -> float:
    """Mean ms per row of `HostRows.row`: one step's summaries (`batch` rows) handed to their
    draws after the step's wait (its outputs already on the host)."""
    total, count = 0.0, 0
    for start in range(0, len(rows) - batch + 1, batch):
        host_rows = HostRows(torch.stack(rows[start : start + batch]), [True] * batch,
                             TOKENIZER_IDS, POLICY_IDS.chunk_eos_ids, with_candidates=False)
        host = {k: v.clone() for k, v in host_rows.outputs.items()}
        begin = time.perf_counter()
        for k in range(batch):
            host_rows.row(k, host)
        total += time.perf_counter() - begin
        count += batch
    return 1e3 * total / count


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
    for knob, name in ((True, "reply knob (no boundary draw)"), (False, "real weights")):
        policy_draws(rows[:20], hist, knob)  # warm-up
        whole_ms, summary_ms = policy_draws(rows, hist, knob)
        print(f"| policy draw, {name}: whole row with its device candidates | {whole_ms:.3f} |")
        print(f"| policy draw, {name}: from the row's summary | {summary_ms:.3f} |")
        step_draws_ms(rows[:32], hist, knob)  # warm-up
        alone_ms, together_ms = step_draws_ms(rows, hist, knob)
        print(f"| policy draw, {name}: a step's 16 summaries, one after another | {alone_ms:.3f} |")
        print(f"| policy draw, {name}: a step's 16 summaries, drawn together | {together_ms:.3f} |")
    summaries_ms(rows[:32])  # warm-up
    print(f"| a step's summary handed to its draw (`HostRows.row`, 16 rows) | {summaries_ms(rows):.3f} |")
    if torch.cuda.is_available():
        on_gpu = [row.cuda() for row in rows]
        mean_ms(on_gpu[:20], lambda row, i: copied_draw(row, hist, i))
        copied = mean_ms(on_gpu, lambda row, i: copied_draw(row, hist, i))
        print(f"| whole draw after the row's device-to-host copy | {copied:.3f} |")


if __name__ == "__main__":
    main()
