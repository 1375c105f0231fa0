"""The runner's fast path: Triton attention and fused layers, graphed decode, device sampling.

`launch` does all host work of a step and queues all device work without waiting: decode
batches (one row per request, at most the largest bucket) replay a CUDA graph over persistent
buffers; mixed batches of short queries (appends next to decodes) replay a graph per
(requests, tokens) bucket (`mixed_graphs`); other batches (long prefills) run eagerly through
the same kernels. Rows whose request has no hook and no repetition penalty are sampled on
the device from the per-slot `SamplingStates`, through the runner's `DeviceLogitsProcessor`
when one is installed (then a graphed decode also replays a sampling graph; on CUDA its
`FusedDraw`, one kernel, where it offers one: `fused_draw`); rows with a hook
or a penalty get their logits row copied to the host and sampled there by the runner's host
sampler, exactly as on the reference path (mixed graphs leave sampling outside the graph), with
each row's top candidates from one device top-k over all of them (`host_draws.TopCandidates`),
so a draw skips its own pass over the 152k-entry row; a hook that draws from a summary gets
that instead of the row (`host_rows`: candidates, logsumexp, probe values; no row copy), and
where its hook yields its draw (`decide_compact`) the step's draws are made together
(`host_draws.run_together`). Tokens, hook logits and captured hidden rows come back through
one `AsyncOutput`, whose `wait` (inside `PendingStep.wait`) is the step's only host wait.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from backends.runner.async_output import AsyncOutput, PendingStep
from backends.runner.backbone import DecoderModel
from backends.runner.block_table import BlockTable
from backends.runner.cuda_graphs import DecodeGraphs, bucket_sizes
from backends.runner.fast_step import Forwarded, SamplePlan, step_results
from backends.runner.fused_draw import sampling_states_for
from backends.runner.host_draws import DrawSteps, TopCandidates, run_together
from backends.runner.host_rows import CompactRow, HostRows
from backends.runner.host_staging import to_device
from backends.runner.input_batch import build_input_batch
from backends.runner.kv_cache import KVCache
from backends.runner.mixed_graphs import MixedGraphs
from backends.runner.mixed_layout import Bucket
from backends.runner.request_states import RequestStates
from backends.runner.types import (
    DeviceLogitsProcessor,
    RunnerConfig,
    SamplingParams,
    StepInput,
    StepResult,
)

# (input, slot, [vocab] logits or their summary, the row's top candidates if known) -> the
# row's sampling as steps (its draw may be yielded: a step's rows draw together)
HostSampler = Callable[[StepInput, int, torch.Tensor | CompactRow, TopCandidates | None], DrawSteps]


class FastPath:
    def __init__(
        self,
        model: DecoderModel,
        config: RunnerConfig,
        kv: KVCache,
        states: RequestStates,
        block_table: BlockTable,
        pad_block: int,
        processor: DeviceLogitsProcessor | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.kv = kv
        self.states = states
        self.block_table = block_table
        # the processor's fused draw where it has one (CUDA), else the torch sampler
        self.sampling = sampling_states_for(config.max_num_reqs, kv.data.device, processor)
        sizes = bucket_sizes(config.cuda_graph_sizes, config.max_num_reqs, bool(config.decode_chain_lengths))
        self.graphs = DecodeGraphs(
            model,
            kv,
            sizes,
            config.max_blocks_per_req,
            pad_block,
            config.max_model_len,
            # Graphed sampling pays off only where device rows always sample: with a processor.
            sampler=self.sampling.sample if processor is not None else None,
            scratch_slot=self.sampling.scratch_slot,
        )
        self.mixed = MixedGraphs.for_config(model, config, kv, pad_block, sizes)
        self.graph_pool: tuple[int, int] | None = None  # one pool for every capture
        if config.use_cuda_graphs and kv.data.device.type == "cuda":
            self.graph_pool = pool = torch.cuda.graph_pool_handle()
            with torch.no_grad():
                self.graphs.capture(pool=pool)
                if self.mixed is not None:
                    self.mixed.capture(pool)

    def warm_attention(self) -> int:
        """Compile every attention kernel variant a step can launch (at load, not mid-reply)."""
        from backends.runner.triton_paged_attention import warm_variants

        return warm_variants(self.kv.key_cache(0), self.kv.value_cache(0), self.model.num_heads,
                             self.config.max_blocks_per_req)

    def admit(self, slot: int, params: SamplingParams) -> None:
        """A request took `slot`: its sampling params reach the device table with the next
        forward (`publish_admissions`)."""
        self.sampling.set(slot, params)

    def publish_admissions(self) -> None:
        """Queue the sampling-table writes of the admissions since the last forward; every
        forward (step, chain) calls it first, since a graph replay reads the table as is."""
        self.sampling.flush()

    def launch(
        self, inputs: list[StepInput], slots: list[int], host_sampler: HostSampler
    ) -> PendingStep:
        """Queue the step; host state (token ledger) advances now, sampled tokens on wait."""
        self.publish_admissions()
        with torch.no_grad():
            plan = self._plan(inputs, slots)
            if all(inp.num_rows == 1 for inp in inputs) and self.graphs.bucket_for(len(inputs)):
                forwarded = self._forward_decode(inputs, slots, plan)
            elif (mixed := self._mixed_bucket(inputs)) is not None:
                forwarded = self._forward_mixed(inputs, slots, plan, mixed)
            else:
                forwarded = self._forward_eager(inputs, slots)
            for inp, slot in zip(inputs, slots):
                self.states.append_tokens(slot, inp.token_ids)
            host_rows = self._host_rows(slots, forwarded, plan)
            output = AsyncOutput(self._outputs(inputs, slots, forwarded, plan, host_rows))
        return PendingStep(
            lambda: self._finish(inputs, slots, forwarded, plan, output, host_rows, host_sampler)
        )

    def _forward_decode(
        self, inputs: list[StepInput], slots: list[int], plan: SamplePlan
    ) -> Forwarded:
        positions = self.states.num_computed_tokens_np[slots]
        ids = [0 if inp.embeds is not None else inp.token_ids[0] for inp in inputs]
        injected = [(i, inp.embeds[0]) for i, inp in enumerate(inputs) if inp.embeds is not None]
        sample_slots = [self.sampling.scratch_slot] * len(inputs)  # host rows draw nothing
        for j in plan.on_device:
            sample_slots[plan.sampled[j]] = slots[plan.sampled[j]]
        block_rows = self.block_table.table_np[slots]
        size = self.graphs.stage(ids, positions, block_rows, injected, sample_slots)
        hidden, logits, tokens = self.graphs.run(size)
        sampled = [i for i, inp in enumerate(inputs) if inp.sample]
        if sampled != list(range(len(sampled))):
            logits = logits.index_select(0, to_device(np.asarray(sampled), logits.device))
        return Forwarded(
            hidden=hidden,
            logits=logits[: len(sampled)],
            row_starts=list(range(len(inputs))),
            positions=[[int(p)] for p in positions],
            tokens=tokens,
        )

    def _mixed_bucket(self, inputs: list[StepInput]) -> Bucket | None:
        return None if self.mixed is None else self.mixed.bucket_for([i.num_rows for i in inputs])

    def _forward_mixed(
        self, inputs: list[StepInput], slots: list[int], plan: SamplePlan, bucket: Bucket
    ) -> Forwarded:
        assert self.mixed is not None
        contexts = self.states.num_computed_tokens_np[slots]
        block_rows = self.block_table.table_np[slots]
        cu = self.mixed.stage(bucket, inputs, contexts, block_rows, plan.sampled)
        hidden, logits = self.mixed.run(bucket)
        return Forwarded(
            hidden=hidden,
            logits=logits[: len(plan.sampled)],
            row_starts=cu[:-1].tolist(),
            positions=[list(range(c, c + i.num_rows)) for c, i in zip(contexts.tolist(), inputs)],
        )

    def _forward_eager(self, inputs: list[StepInput], slots: list[int]) -> Forwarded:
        batch = build_input_batch(
            slots=slots,
            num_rows=[inp.num_rows for inp in inputs],
            num_computed=[int(self.states.num_computed_tokens_np[s]) for s in slots],
            block_table=self.block_table,
            block_size=self.kv.block_size,
            backend="triton",
        )
        embeds = self._embeds(inputs, batch.cu_num_tokens_np)
        hidden = self.model.forward(embeds, batch.positions, batch.meta, self.kv)
        last_rows = [int(batch.cu_num_tokens_np[i + 1]) - 1 for i, inp in enumerate(inputs)
                     if inp.sample]  # fmt: skip
        index = to_device(np.asarray(last_rows, dtype=np.int64), hidden.device)
        rows = hidden.index_select(0, index)
        return Forwarded(
            hidden=hidden,
            logits=self.model.compute_logits(rows),
            row_starts=batch.cu_num_tokens_np[:-1].tolist(),
            positions=[batch.positions_np[batch.rows(i)].tolist() for i in range(len(inputs))],
        )

    def _embeds(self, inputs: list[StepInput], cu_rows: np.ndarray) -> torch.Tensor:
        """[num_tokens, hidden] in the KV dtype: token rows embedded, injected rows copied in."""
        device, dtype = self.kv.data.device, self.kv.data.dtype
        ids = np.concatenate(
            [np.zeros(inp.num_rows, np.int64) if inp.embeds is not None
             else np.asarray(inp.token_ids, np.int64) for inp in inputs]
        )  # fmt: skip
        embeds = self.model.embed_tokens(to_device(ids, device)).to(dtype)
        for i, inp in enumerate(inputs):
            if inp.embeds is not None:
                source = inp.embeds
                if device.type == "cuda" and source.device.type == "cpu":
                    source = source.pin_memory()  # a pageable source would block the host
                embeds[int(cu_rows[i]) : int(cu_rows[i + 1])].copy_(source, non_blocking=True)
        return embeds

    def _plan(self, inputs: list[StepInput], slots: list[int]) -> SamplePlan:
        sampled = [i for i, inp in enumerate(inputs) if inp.sample]
        on_device, on_host = [], []
        for j, i in enumerate(sampled):
            (on_host if self.states.samples_on_host(slots[i]) else on_device).append(j)
        return SamplePlan(sampled, on_device, on_host)

    def _outputs(
        self,
        inputs: list[StepInput],
        slots: list[int],
        forwarded: Forwarded,
        plan: SamplePlan,
        host_rows: HostRows | None,
    ) -> dict[str, torch.Tensor]:
        device = forwarded.logits.device
        outputs: dict[str, torch.Tensor] = {}
        if plan.on_device and forwarded.tokens is not None:
            outputs["tokens"] = forwarded.tokens[: len(inputs)]  # picked by batch row on wait
        elif plan.on_device:
            logits = self._rows(forwarded.logits, plan.on_device, len(plan.sampled))
            device_slots = [slots[plan.sampled[j]] for j in plan.on_device]
            outputs["tokens"] = self._sample(logits, device_slots)
        if host_rows is not None:
            outputs.update(host_rows.outputs)
        captured = [
            row
            for i, inp in enumerate(inputs)
            if inp.capture_hidden
            for row in range(forwarded.row_starts[i], forwarded.row_starts[i] + inp.num_rows)
        ]
        if captured:
            index = to_device(np.asarray(captured, dtype=np.int64), device)
            outputs["hidden"] = forwarded.hidden.index_select(0, index).to(torch.float32)
        return outputs

    @staticmethod
    def _rows(tensor: torch.Tensor, rows: list[int], num_rows: int) -> torch.Tensor:
        if rows == list(range(num_rows)):
            return tensor
        return tensor.index_select(0, to_device(np.asarray(rows, dtype=np.int64), tensor.device))

    def _sample(self, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """logits: [rows, vocab] float32 -> [rows] int64 tokens drawn on the device.

        Called after the step's tokens joined the ledger, so num_computed is where each
        sampled token will sit (the position its noise is keyed on)."""
        params = [self.states.sampling[slot] for slot in slots]
        if self.sampling.processor is None and all(p.is_greedy for p in params):
            return torch.argmax(logits, dim=-1)  # the common case: nothing to stage
        rows = np.stack([np.asarray(slots), self.states.num_computed_tokens_np[slots]])
        index = to_device(rows.astype(np.int64), logits.device)  # [2, rows]: slots, positions
        use_filters = any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.is_greedy)
        return self.sampling.sample(logits, index[0], index[1], use_filters)

    def _host_rows(
        self, slots: list[int], forwarded: Forwarded, plan: SamplePlan
    ) -> HostRows | None:
        if not plan.on_host:
            return None
        rows = self._rows(forwarded.logits, plan.on_host, len(plan.sampled))
        return HostRows.for_slots(rows, [slots[plan.sampled[j]] for j in plan.on_host],
                                  self.states, self.config)

    def _finish(
        self,
        inputs: list[StepInput],
        slots: list[int],
        forwarded: Forwarded,
        plan: SamplePlan,
        output: AsyncOutput,
        host_rows: HostRows | None,
        host_sampler: HostSampler,
    ) -> list[StepResult]:
        host = output.wait()
        tokens: list[int | None] = [None] * len(inputs)
        device_tokens = host["tokens"].tolist() if plan.on_device else []
        for k, j in enumerate(plan.on_device):
            i = plan.sampled[j]
            token = int(device_tokens[i if forwarded.tokens is not None else k])
            tokens[i] = token
            self.states.generated[slots[i]].append(token)
        if host_rows is not None:
            hints = host_rows.candidates(host)
            rows = [plan.sampled[j] for j in plan.on_host]
            steps = [host_sampler(inputs[i], slots[i], host_rows.row(k, host), hints[k])
                     for k, i in enumerate(rows)]  # fmt: skip
            for i, token in zip(rows, run_together(steps)):
                tokens[i] = token
        return step_results(inputs, forwarded.positions, tokens, host.get("hidden"))
