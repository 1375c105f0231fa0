"""Runner benchmark on one GPU: Thinker decode and appends, Talker decode, against the floor.

The Thinker has the real MiniCPM-o 4.5 / Qwen3-8B dims and the Talker the real Llama dims,
both with random bf16 weights built directly on the GPU, run through `ModelRunner`'s fast path
(paged KV with block size 16, Triton attention, fused layer kernels, CUDA graphs). KV contents
are random: the benchmark sets each request's context length instead of prefilling it.

Reported per configuration:
- graph ms: device time of one graphed decode step (forward + LM head), median over replays;
- step ms: wall time of a whole `ModelRunner.step` (host staging, replay, device sampling,
  async copy, the host wait), median;
- floor ms: (weight bytes + KV bytes read) / the device-to-device copy bandwidth measured in
  this run (bytes read + written over time), and graph ms / floor.

Talker decode chains (`ModelRunner.decode_chain`, what `TalkerEngine.step` runs once every
chunk is decoding), on a runner set up as the Talker engine's (device chunk policy, seeded
sampling, chain graphs), per batch: the wall ms of one single step; per chain length K, the
wall ms of one chain / K and its device ms (graph replay, restaged each time) / K; the wall ms
of 25 decode draws single-stepped and chained as the engine chains them (8 + 8 + 8 + 1 for K 8, 12 + 12 + 1 for the served K 12).

Writes DIR/runner_h200.md (DIR defaults to perf/out; perf/results/runner_h200.md is a page
assembled by hand from this and the kernel sweeps, so DIR may not be perf/results) and
per-kernel device-time profiles (`profile_*.txt`) of three configurations.

Usage: python perf/bench_runner.py [--out DIR] [--commit SHA] [--quick]
       [--chain-lengths 8[,4,...]] [--talker-only]
(the decoders' matmuls run on the Triton skinny GEMM with its norm / SwiGLU prologues, as
served; `--talker-only` skips the Thinker, the long part.)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.models.llama import LlamaBackbone, LlamaBackboneConfig, LlamaWithHead  # noqa: E402
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from backends.models.talker_policy import (  # noqa: E402
    CHUNK_BUDGETS,
    CODEC_EOS,
    ChunkKind,
    TalkerSamplingConfig,
)
from backends.runner.model_runner import ModelRunner  # noqa: E402
from backends.runner.types import RunnerConfig, SamplingParams, StepInput  # noqa: E402
from backends.talker.policy_table import TalkerPolicyTable  # noqa: E402
from perf.switches import active_switches  # noqa: E402

THINKER = Qwen3Config(
    hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, intermediate_size=12288, vocab_size=151748,
)  # fmt: skip
TALKER = LlamaBackboneConfig(
    hidden_size=768, num_hidden_layers=20, num_attention_heads=12, num_key_value_heads=12,
    intermediate_size=3072, vocab_size=32000,
)  # fmt: skip
TALKER_CODEC_VOCAB = 6562
BLOCK_SIZE = 16
THINKER_BATCHES = (1, 2, 4, 8, 16)
THINKER_CONTEXTS = (1024, 4096)
TALKER_BATCHES = (1, 2, 4, 8, 16)
TALKER_CONTEXT = 256
APPEND_SESSIONS, APPEND_ROWS, APPEND_CONTEXT = 16, 13, 1024
CHAIN_LENGTHS = [(8,)]  # RunnerConfig.decode_chain_lengths of the Talker, set from --chain-lengths
FRAMES = 25  # decode draws of one steady Talker chunk
ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "perf" / "out"
RESULTS_DIR = ROOT / "perf" / "results"  # hand-made pages: never written here


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    batch: int
    context: int
    graph_ms: float
    step_ms: float
    floor_ms: float

    @property
    def ratio(self) -> float:
        return self.graph_ms / self.floor_ms

    def line(self) -> str:
        return (
            f"{self.model:17s} batch {self.batch:2d} ctx {self.context:5d}: graph "
            f"{self.graph_ms:7.3f} ms  step {self.step_ms:7.3f} ms  floor {self.floor_ms:6.3f} "
            f"ms  ratio {self.ratio:5.2f}"
        )


def device_ms(fn: Callable[[], object], iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean device time of `iters` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def copy_bandwidth(num_bytes: int = 4 << 30) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = device_ms(lambda: dst.copy_(src), iters=10)
    return 2 * num_bytes / (ms * 1e-3)


def build_on_gpu(factory: Callable[[], nn.Module]) -> nn.Module:
    """Random bf16 weights allocated and initialised on the GPU (no host copy)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return factory().eval()
    finally:
        torch.set_default_dtype(previous)


def streamed_weight_bytes(model: nn.Module, embedding_tables: list[nn.Module]) -> int:
    """Bytes of every parameter a decode step reads: all but the embedding tables, whose few
    looked-up rows are negligible."""
    skip = {id(p) for table in embedding_tables for p in table.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)


def make_runner(model: nn.Module, max_reqs: int, max_len: int) -> ModelRunner:
    config = RunnerConfig(
        num_blocks=max_reqs * -(-max_len // BLOCK_SIZE), max_num_reqs=max_reqs,
        max_model_len=max_len, block_size=BLOCK_SIZE, device="cuda", dtype=torch.bfloat16,
        attention_backend="triton", cuda_graph_sizes=(1, 2, 4, 8, 16),
        gemv_backend="triton",
    )  # fmt: skip
    runner = ModelRunner(model, config)  # type: ignore[arg-type]
    for i in range(max_reqs):
        runner.add_request(f"r{i}", SamplingParams(), max_len=max_len)
    runner.kv.data.normal_()  # random K/V: attention over zeros would flatter the timing
    return runner


def set_context(runner: ModelRunner, request_ids: list[str], context: int) -> None:
    """Pretend each request holds `context` tokens in KV (random contents), host side only."""
    for rid in request_ids:
        runner.states.num_computed_tokens_np[runner.states.slot_of(rid)] = context


@dataclass(frozen=True, slots=True)
class Floor:
    weight_bytes: int  # streamed per step
    kv_bytes_per_token: int  # read per token of context
    bandwidth: float  # bytes/s

    def ms(self, batch: int, context: int) -> float:
        total = self.weight_bytes + batch * context * self.kv_bytes_per_token
        return total / self.bandwidth * 1e3


def decode_row(
    name: str, runner: ModelRunner, batch: int, context: int, floor: Floor, iters: int
) -> Row:
    rids = [f"r{i}" for i in range(batch)]
    feed = [StepInput(rid, [1 + i]) for i, rid in enumerate(rids)]
    set_context(runner, rids, context - 1)
    runner.step(feed)  # stages the buffers for this batch at this context
    graphs = runner.fast_path.graphs  # type: ignore[union-attr]
    bucket = graphs.bucket_for(batch)
    graph_ms = device_ms(lambda: graphs.replay(bucket), iters)
    walls = []
    for _ in range(iters):
        set_context(runner, rids, context - 1)
        start = time.perf_counter()
        runner.step(feed)
        walls.append((time.perf_counter() - start) * 1e3)
    return Row(name, batch, context, graph_ms, statistics.median(walls), floor.ms(batch, context))


def kv_bytes_per_token(runner: ModelRunner) -> int:
    kv = runner.kv
    return kv.num_layers * 2 * kv.num_kv_heads * kv.head_dim * kv.data.element_size()


def bench_thinker(bandwidth: float, iters: int, out: list[str], profile_dir: Path) -> list[Row]:
    model = build_on_gpu(lambda: Qwen3ForCausalLM(THINKER))
    weights = streamed_weight_bytes(model, [model.model.embed_tokens])
    runner = make_runner(model, max(THINKER_BATCHES), max(THINKER_CONTEXTS) + 64)
    floor = Floor(weights, kv_bytes_per_token(runner), bandwidth)
    out.append(
        f"thinker streamed weight bytes {weights / 1e9:.3f} GB, "
        f"KV {floor.kv_bytes_per_token} B per token of context"
    )
    rows = []
    for context in THINKER_CONTEXTS:
        for batch in THINKER_BATCHES:
            rows.append(decode_row("thinker", runner, batch, context, floor, iters))
            print(rows[-1].line(), flush=True)
            if (batch, context) in ((1, 1024), (16, 4096)):
                name = f"profile_thinker_b{batch}_{context}.txt"
                profile_kernels(runner, batch, profile_dir / name)
    out.append(bench_appends(runner))
    print(out[-1], flush=True)
    out.append(bench_mixed(runner))
    print(out[-1], flush=True)
    del runner, model
    gc.collect()  # the runner's pending step closes over the runner: a reference cycle
    torch.cuda.empty_cache()
    return rows


def _median_step_ms(runner: ModelRunner, rids: list[str], feed: list[StepInput],
                    repeats: int) -> float:
    """Median wall ms of `runner.step(feed)` at APPEND_CONTEXT (each run from the same
    context), the first two runs dropped as warm-up."""
    walls = []
    for _ in range(repeats):
        set_context(runner, rids, APPEND_CONTEXT)
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.step(feed)
        walls.append((time.perf_counter() - start) * 1e3)
    return statistics.median(walls[2:])


def bench_appends(runner: ModelRunner) -> str:
    """16 sessions each append one unit (13 rows) at 1k context in one mixed forward (graphed
    when the runner's mixed graphs are on, the default)."""
    rids = [f"r{i}" for i in range(APPEND_SESSIONS)]
    feed = [StepInput(rid, list(range(10, 10 + APPEND_ROWS))) for rid in rids]
    ms = _median_step_ms(runner, rids, feed, repeats=8)
    tokens = APPEND_SESSIONS * APPEND_ROWS
    return (
        f"thinker append {APPEND_SESSIONS} x {APPEND_ROWS} rows at ctx {APPEND_CONTEXT}: "
        f"{ms:.3f} ms per step, {tokens / ms * 1e3:,.0f} tokens/s"
    )


def bench_mixed(runner: ModelRunner, appending: int = 4) -> str:
    """A duplex-like step at 1k context: `appending` of 16 sessions append 13 rows, the rest
    decode one; wall time per step with the mixed graphs off (eager) and on (graphed)."""
    rids = [f"r{i}" for i in range(APPEND_SESSIONS)]
    feed = [StepInput(rid, list(range(10, 10 + APPEND_ROWS)) if i < appending else [5])
            for i, rid in enumerate(rids)]  # fmt: skip
    fast_path = runner.fast_path
    assert fast_path is not None and fast_path.mixed is not None
    mixed, times = fast_path.mixed, {}
    for name, graphs in (("eager", None), ("graphed", mixed)):
        fast_path.mixed = graphs
        times[name] = _median_step_ms(runner, rids, feed, repeats=10)
    fast_path.mixed = mixed
    return (
        f"thinker mixed step ({appending} x {APPEND_ROWS} appended rows + "
        f"{APPEND_SESSIONS - appending} decodes) at ctx {APPEND_CONTEXT}: eager "
        f"{times['eager']:.3f} ms, graphed {times['graphed']:.3f} ms per step "
        f"({mixed.num_captured} mixed graphs captured)"
    )


def bench_talker(
    bandwidth: float, iters: int, profile_dir: Path, tables: list[str]
) -> list[Row]:
    def factory() -> nn.Module:
        head = nn.Linear(TALKER.hidden_size, TALKER_CODEC_VOCAB, bias=False)
        table = nn.Embedding(TALKER_CODEC_VOCAB, TALKER.hidden_size)
        return LlamaWithHead(LlamaBackbone(TALKER), head, table)

    model = build_on_gpu(factory)
    weights = streamed_weight_bytes(model, [model.backbone.embed_tokens, model.embedding])
    runner = make_runner(model, max(TALKER_BATCHES), TALKER_CONTEXT + 64)
    floor = Floor(weights, kv_bytes_per_token(runner), bandwidth)
    rows = []
    for batch in TALKER_BATCHES:
        rows.append(decode_row("talker", runner, batch, TALKER_CONTEXT, floor, iters))
        print(rows[-1].line(), flush=True)
        if batch == 1:
            profile_kernels(runner, batch, profile_dir / "profile_talker_b1.txt")
    del runner
    gc.collect()
    chained = chain_runner(model, max(TALKER_BATCHES), TALKER_CONTEXT + 64)
    chain_rows = []
    for batch in TALKER_BATCHES:
        chain_rows.append(chain_row(chained, batch, TALKER_CONTEXT, iters))
        print(chain_line(chain_rows[-1]), flush=True)
    tables.extend(chain_markdown(chain_rows, TALKER_CONTEXT))
    return rows


@dataclass(frozen=True, slots=True)
class ChainRow:
    batch: int
    step_ms: float
    chain_ms: dict[int, tuple[float, float]]  # length -> (wall ms / step, device ms / step)
    frames_single_ms: float
    frames_chained_ms: float


def chain_runner(model: nn.Module, max_reqs: int, max_len: int) -> ModelRunner:
    sampling = TalkerSamplingConfig()
    table = TalkerPolicyTable(max_reqs, "cuda", sampling, CODEC_EOS)
    config = RunnerConfig(
        num_blocks=max_reqs * -(-max_len // BLOCK_SIZE), max_num_reqs=max_reqs,
        max_model_len=max_len, block_size=BLOCK_SIZE, device="cuda", dtype=torch.bfloat16,
        attention_backend="triton", cuda_graph_sizes=(1, 2, 4, 8, 16),
        gemv_backend="triton", decode_chain_lengths=CHAIN_LENGTHS[0],
    )  # fmt: skip
    runner = ModelRunner(model, config, table)  # type: ignore[arg-type]
    params = sampling.to_sampling_params()
    for i in range(max_reqs):
        runner.add_request(f"r{i}", dataclasses.replace(params, seed=i), max_len=max_len)
        slot = runner.states.slot_of(f"r{i}")
        table.open(slot)
        table.begin_chunk(slot, CHUNK_BUDGETS[ChunkKind.TURN_END])
    runner.kv.data.normal_()
    return runner


def _wall_ms(run: Callable[[], object], reset: Callable[[], None], iters: int) -> float:
    walls = []
    for _ in range(iters):
        reset()
        start = time.perf_counter()
        run()
        walls.append((time.perf_counter() - start) * 1e3)
    return statistics.median(walls)


def _plan(lengths: tuple[int, ...], draws: int) -> list[int]:
    """The engine's chain lengths for `draws` decode draws of one chunk."""
    plan = []
    while draws > 0:
        plan.append(max((n for n in lengths if n <= draws), default=1))
        draws -= plan[-1]
    return plan


def chain_row(runner: ModelRunner, batch: int, context: int, iters: int) -> ChainRow:
    rids = [f"r{i}" for i in range(batch)]
    feed = [StepInput(rid, [1 + i]) for i, rid in enumerate(rids)]

    def reset() -> None:
        for rid in rids:
            runner.states.num_computed_tokens_np[runner.states.slot_of(rid)] = context - 1

    def draws(plan: list[int]) -> None:
        for length in plan:
            runner.decode_chain(feed, length) if length > 1 else runner.step(feed)

    chains, lengths = runner.chains, runner.chain_lengths
    assert chains is not None
    slots = [runner.states.slot_of(rid) for rid in rids]
    block_rows = runner.block_table.table_np[slots]
    positions = np.full(batch, context - 1, dtype=np.int64)

    def replay(length: int) -> None:  # restaged each time: a chain advances its buffers
        size = chains.graphs.stage([1 + i for i in range(batch)], positions, block_rows, (), slots)
        chains.run(size, length)

    timed = {}
    for length in lengths:
        reset()
        runner.decode_chain(feed, length)  # warms the graph
        graph_ms = device_ms(lambda: replay(length), iters) / length
        wall = _wall_ms(lambda: runner.decode_chain(feed, length), reset, iters) / length
        timed[length] = (wall, graph_ms)
    return ChainRow(
        batch=batch,
        step_ms=_wall_ms(lambda: runner.step(feed), reset, iters),
        chain_ms=timed,
        frames_single_ms=_wall_ms(lambda: draws([1] * FRAMES), reset, iters),
        frames_chained_ms=_wall_ms(lambda: draws(_plan(lengths, FRAMES)), reset, iters),
    )


def chain_line(row: ChainRow) -> str:
    chained = "  ".join(
        f"chain {n}: {wall:6.3f} ms/step (graph {graph:6.3f})"
        for n, (wall, graph) in row.chain_ms.items()
    )
    return (f"talker batch {row.batch:2d}: step {row.step_ms:6.3f} ms  {chained}  25 frames "
            f"{row.frames_single_ms:6.2f} ms single, {row.frames_chained_ms:6.2f} ms chained")


def chain_markdown(rows: list[ChainRow], context: int) -> list[str]:
    lengths = list(rows[0].chain_ms) if rows else []
    head = "| batch | step ms | " + " | ".join(
        f"chain {n} ms/step | chain {n} graph ms/step" for n in lengths
    ) + " | 25 frames single ms | 25 frames chained ms |"
    lines = ["", f"## Talker decode chains (device policy, seeded sampling, ctx {context})", "",
             head, "| " + " | ".join(["---"] * (4 + 2 * len(lengths))) + " |"]  # fmt: skip
    for r in rows:
        cells = [f"{wall:.3f} | {graph:.3f}" for wall, graph in r.chain_ms.values()]
        lines.append(f"| {r.batch} | {r.step_ms:.3f} | " + " | ".join(cells)
                     + f" | {r.frames_single_ms:.2f} | {r.frames_chained_ms:.2f} |")  # fmt: skip
    return lines


def profile_kernels(runner: ModelRunner, batch: int, path: Path) -> None:
    """Per-kernel device times of the staged bucket's forward, run eagerly (the same kernels
    the graph replays), into `path`."""
    with torch.inference_mode():  # as captured: under autograd the GEMV falls back to cuBLAS
        _profile_kernels(runner, batch, path)


def _profile_kernels(runner: ModelRunner, batch: int, path: Path) -> None:
    graphs = runner.fast_path.graphs  # type: ignore[union-attr]
    bucket = graphs.bucket_for(batch)
    graphs.forward_eager(bucket)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            graphs.forward_eager(bucket)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    for key in ("self_cuda_time_total", "self_device_time_total", "cuda_time_total"):
        try:
            path.write_text(averages.table(sort_by=key, row_limit=30, max_name_column_width=90))
            return
        except (AttributeError, KeyError, ValueError):
            continue


def markdown(
    rows: list[Row], notes: list[str], command: str, commit: str, bandwidth: float,
    tables: list[str],
) -> str:
    lines = [
        "# Runner on one H200 (fast path: paged KV bs 16, Triton attention, CUDA graphs)",
        "",
        f"- command: `{command}`",
        f"- commit: `{commit}`; device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
        f"- copy bandwidth (read + write): {bandwidth / 1e12:.2f} TB/s",
        f"- switches: {active_switches()}",
        "",
        "| model | batch | context | graph ms | step ms | floor ms | graph / floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.batch} | {r.context} | {r.graph_ms:.3f} | {r.step_ms:.3f} "
            f"| {r.floor_ms:.3f} | {r.ratio:.2f} |"
        )
    return "\n".join(lines + [""] + [f"- {note}" for note in notes] + tables) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder for runner_h200.md")
    parser.add_argument("--commit", default="unknown", help="git commit of the tree measured")
    parser.add_argument("--quick", action="store_true", help="fewer timed iterations")
    parser.add_argument("--chain-lengths", default="8",
                        help="Talker decode-chain lengths to measure, comma-separated (>= 2)")
    parser.add_argument("--talker-only", action="store_true", help="skip the Thinker")
    args = parser.parse_args()
    if args.out.resolve() == RESULTS_DIR:
        parser.error("--out perf/results would overwrite the hand-made runner_h200.md: use perf/out")
    CHAIN_LENGTHS[0] = tuple(int(n) for n in args.chain_lengths.split(","))
    iters = 5 if args.quick else 20
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write)", flush=True)
    notes: list[str] = []
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [] if args.talker_only else bench_thinker(bandwidth, iters, notes, args.out)
    tables: list[str] = []
    rows += bench_talker(bandwidth, iters, args.out, tables)
    command = "python " + " ".join(sys.argv)
    text = markdown(rows, notes, command, args.commit, bandwidth, tables)
    (args.out / "runner_h200.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
