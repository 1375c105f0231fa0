"""Decode chains: K decode steps of the same requests queued at once, one host wait at the end.

A chain stages one decode batch in the decode graphs' buffers (as a graphed decode step does),
then runs K times: forward, device draw, and between two steps `DecodeGraphs.advance` (each
row's drawn token becomes its next input id, its position and lengths grow by one, its KV slot
is looked up in its staged block-table row), all on the device. The K x rows tokens come back
through one `AsyncOutput`. On CUDA each (decode bucket, length) pair is one CUDA graph,
captured at load into the fast path's pool; lengths without a graph, and CPU runs, execute the
very same ops eagerly.

Only plain decodes chain (`check_chain`): one token-id row per request, drawn on the device,
no hidden rows captured, and room in the request's KV reservation for all K rows, so a chain
never writes outside the request's own blocks. The draws are the single steps' draws: the
noise is keyed on (seed, position) and the logits processor sees each step's rows in order.
The runner commits all K steps; what follows a row's stop token is the caller's to take back
(`RequestStates.discard_tail`: KV rows stay, to be overwritten). A processor's state after
such draws is the stage's concern (the Talker's table forces EOS after a chunk's EOS and keeps
those draws out of its penalty window).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from backends.runner.async_output import AsyncOutput, Pending
from backends.runner.block_table import BlockTable
from backends.runner.cuda_graphs import DecodeGraphs, RowSampler, capture_graph
from backends.runner.request_states import RequestStates
from backends.runner.types import ChainResult, StepInput

_LOG = logging.getLogger(__name__)


class PendingChain(Pending[ChainResult]):
    """A launched chain; `wait` reads its tokens and commits them to the host state once."""


def check_chain(
    inputs: list[StepInput], slots: list[int], length: int, states: RequestStates, capacity: int
) -> None:
    """Raise ValueError unless `inputs` can run as a chain of `length` steps."""
    if length < 1 or len(inputs) > capacity:
        raise ValueError(f"a chain of {length} steps over {len(inputs)} rows (largest decode "
                         f"bucket {capacity}) cannot run")  # fmt: skip
    for inp, slot in zip(inputs, slots):
        if inp.num_rows != 1 or inp.embeds is not None or not inp.sample or inp.capture_hidden:
            raise ValueError(f"request {inp.request_id!r}: only plain decodes chain (one token "
                             "id row, sampled, no injected embeds, no captured hidden rows)")
        if states.samples_on_host(slot):
            raise ValueError(f"request {inp.request_id!r} samples on the host: it cannot chain")
        room = int(states.max_len_np[slot] - states.num_computed_tokens_np[slot])
        if length > room:
            raise ValueError(f"request {inp.request_id!r}: a chain of {length} steps needs "
                             f"{length} KV rows, its reservation has {room} left")


class DecodeChains:
    def __init__(self, graphs: DecodeGraphs, sampler: RowSampler, lengths: Sequence[int]) -> None:
        self.graphs = graphs
        self.sampler = sampler
        self.lengths = tuple(sorted(set(lengths)))
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def launch(
        self,
        inputs: list[StepInput],
        slots: list[int],
        length: int,
        states: RequestStates,
        block_table: BlockTable,
    ) -> PendingChain:
        """Queue the chain (inputs checked by `check_chain`); the rows join the ledger now,
        the drawn tokens when the chain is waited on."""
        starts = states.num_computed_tokens_np[slots].copy()
        ids = [inp.token_ids[0] for inp in inputs]
        with torch.no_grad():
            size = self.graphs.stage(ids, starts, block_table.table_np[slots], (), slots)
            output = AsyncOutput({"tokens": self.run(size, length)})
        for inp, slot in zip(inputs, slots):
            states.append_tokens(slot, inp.token_ids + [0] * (length - 1))
        return PendingChain(lambda: _finish(inputs, slots, starts, states, output))

    def run(self, size: int, length: int) -> torch.Tensor:
        """The staged bucket's chain: [length, size] int64 drawn tokens (a static tensor when
        replayed from a graph: read it before the next chain of this shape)."""
        captured = self._graphs.get((size, length))
        if captured is None:
            return self.run_eager(size, length)
        captured[0].replay()
        return captured[1]

    def run_eager(self, size: int, length: int) -> torch.Tensor:
        """The chain without its graph (what capture records)."""
        graphs, steps = self.graphs, []
        for k in range(length):
            if k:
                graphs.advance(size, steps[-1])
            logits = graphs.forward_eager(size)[1]
            steps.append(self.sampler(logits, graphs.sample_slots[:size], graphs.positions[:size] + 1))
        return torch.stack(steps)

    def capture(self, pool: tuple[int, int], warmup_steps: int = 1) -> None:
        """One graph per (bucket, length), largest bucket first, on padding rows only (pad
        block, scratch slot). A chain that fails to capture runs eagerly (still no sync)."""
        empty_rows = np.zeros((0, self.graphs.max_blocks_per_req), dtype=np.int32)
        side = torch.cuda.Stream()  # every warm-up on one stream: its cached blocks are reused
        for size in reversed(self.graphs.sizes):
            for length in self.lengths:
                self.graphs.stage([], np.zeros(0, dtype=np.int64), empty_rows)
                try:
                    self._graphs[(size, length)] = capture_graph(
                        lambda: self.run_eager(size, length), pool, warmup_steps, side
                    )
                except RuntimeError:
                    _LOG.warning("chain capture failed: bucket %d, length %d", size, length,
                                 exc_info=True)  # fmt: skip
        torch.cuda.synchronize()


def _finish(
    inputs: list[StepInput],
    slots: list[int],
    starts: np.ndarray,
    states: RequestStates,
    output: AsyncOutput,
) -> list[ChainResult]:
    tokens = output.wait()["tokens"][:, : len(inputs)].T.tolist()  # [rows][length]
    results = []
    for inp, slot, start, row in zip(inputs, slots, starts.tolist(), tokens):
        states.commit_chain(slot, start, row)
        results.append(ChainResult(inp.request_id, list(range(start, start + len(row))), row))
    return results
