"""ModelRunner: admission with exact KV reservation, one mixed forward per step, re-anchoring.

Rule for this file: it orchestrates and stays small (<= 400 lines, enforced by a test).
Anything with its own state or math belongs in its own module (block pool, block table,
request states, input batch, sampler, attention, rope).

Host work per step happens in `_prepare` (slot lookups, batch layout, embeddings) and after the
forward (`_sample`, the single place where sampled token values reach the host); the model's
forward itself never reads device values. With the "triton" backend a step goes through
`FastPath` instead (graphed decode, device sampling, async outputs); `launch_step` returns the
step before its outputs are read, and every other runner call settles it first. There, plain
decodes may also run as a decode chain (`decode_chain`: K steps on the device, one host wait;
see `backends.runner.decode_chain`).

A stage may install a `DeviceLogitsProcessor` (its sampling policy as per-slot device tables)
instead of giving each request a host hook: it then runs on every row sampled without a hook
or HF penalty, on both paths (the reference path draws those rows on the host after it).
"""

from __future__ import annotations

from functools import partial

import torch

from backends.runner.async_output import PendingStep
from backends.runner.attention import check_backend
from backends.runner.backbone import DecoderModel
from backends.runner.block_pool import BlockPool
from backends.runner.block_table import BlockTable
from backends.runner.decode_chain import DecodeChains, PendingChain, check_chain
from backends.runner.fast_path import FastPath
from backends.runner.host_draws import DrawSteps, TopCandidates, run_alone
from backends.runner.host_rows import CompactRow
from backends.runner.input_batch import InputBatch, build_input_batch
from backends.runner.kv_cache import KVCache
from backends.runner.reanchor import check_reanchor, reanchor_slot
from backends.runner.request_states import RequestStates
from backends.runner.sampler import sample_steps
from backends.runner.types import (
    AdmissionError,
    ChainResult,
    DeviceLogitsProcessor,
    RunnerConfig,
    SampleContext,
    SamplingHook,
    SamplingParams,
    StepInput,
    StepResult,
)


class ModelRunner:
    """One per stage, driven by one engine thread (no internal locking).

    The model's weights must already be on `config.device` in `config.dtype`; the KV cache,
    block table and per-step tensors are created there. The fast path adds one pad block
    (id `num_blocks`, never handed out) that padding rows of graphed batches write to.
    """

    def __init__(
        self,
        model: DecoderModel,
        config: RunnerConfig,
        logits_processor: DeviceLogitsProcessor | None = None,
    ) -> None:
        check_backend(config.attention_backend)
        model.set_gemv_backend(config.gemv_backend)
        self.model = model
        self.config = config
        self.logits_processor = logits_processor
        self.block_size = config.block_size
        self.kv = KVCache(
            num_layers=model.num_layers,
            num_blocks=config.num_blocks + int(config.is_fast_path),
            block_size=config.block_size,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            dtype=config.dtype,
            device=config.device,
        )
        self.block_pool = BlockPool(config.num_blocks)
        self.block_table = BlockTable(
            config.max_num_reqs, config.max_blocks_per_req, config.device
        )
        self.states = RequestStates(config.max_num_reqs, config.max_model_len)
        self.fast_path: FastPath | None = None
        if config.is_fast_path:
            self.fast_path = FastPath(
                model, config, self.kv, self.states, self.block_table, config.num_blocks,
                logits_processor,
            )  # fmt: skip
        self.chains = self._make_chains()
        self._pending: PendingStep | PendingChain = PendingStep.done([])

    def warm_attention(self) -> int:
        """Compile the fast path's attention kernel variants now; returns the launches."""
        return 0 if self.fast_path is None else self.fast_path.warm_attention()

    def _make_chains(self) -> DecodeChains | None:
        """Decode chains run on the fast path (device sampling); graphs for the configured
        lengths are captured into the fast path's pool."""
        fast = self.fast_path
        if fast is None:
            return None
        lengths = self.config.decode_chain_lengths or ()
        chains = DecodeChains(fast.graphs, fast.sampling.sample, lengths)
        if fast.graph_pool is not None and chains.lengths:
            with torch.no_grad():
                chains.capture(fast.graph_pool)
        return chains

    def add_request(
        self,
        request_id: str,
        sampling: SamplingParams,
        hook: SamplingHook | None = None,
        max_len: int | None = None,
    ) -> None:
        """Admit a request and reserve KV for `max_len` tokens (default max_model_len) now, so
        no later step can run out of pages. Raises AdmissionError, changing nothing, if the
        slot or the blocks are not available."""
        self._pending.settle()
        max_len = self.config.max_model_len if max_len is None else max_len
        if max_len < 1:
            raise ValueError(f"request {request_id!r}: max_len must be >= 1, got {max_len}")
        if request_id in self.states.req_id_to_slot:
            raise ValueError(f"request {request_id!r} is already active")
        num_blocks = self._check_admission(request_id, max_len)
        slot = self.states.add(request_id, sampling, hook, max_len)
        self.block_table.set_row(slot, self.block_pool.allocate(num_blocks))
        if self.logits_processor is not None:
            self.logits_processor.reset_slot(slot)
        if self.fast_path is not None:
            self.fast_path.admit(slot, sampling)

    def _check_admission(self, request_id: str, max_len: int) -> int:
        if max_len > self.config.max_model_len:
            raise AdmissionError(
                f"request {request_id!r}: max_len {max_len} exceeds the runner's "
                f"max_model_len {self.config.max_model_len}"
            )
        if self.states.num_free_slots == 0:
            raise AdmissionError(
                f"request {request_id!r}: all {self.config.max_num_reqs} runner slots are in use"
            )
        num_blocks = -(-max_len // self.block_size)
        if not self.block_pool.can_allocate(num_blocks):
            raise AdmissionError(
                f"request {request_id!r}: reserving {max_len} tokens needs {num_blocks} KV "
                f"blocks of {self.block_size}, only {self.block_pool.num_free_blocks} free"
            )
        return num_blocks

    def free_request(self, request_id: str) -> None:
        """Free the slot and every KV block of the request; unknown ids are ignored."""
        self._pending.settle()
        slot = self.states.req_id_to_slot.get(request_id)
        if slot is None:
            return
        self.block_pool.free(self.block_table.row(slot))
        self.block_table.clear_row(slot)
        self.states.remove(request_id)

    def num_tokens(self, request_id: str) -> int:
        """Tokens now held in KV for the request."""
        return int(self.states.num_computed_tokens_np[self.states.slot_of(request_id)])

    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    def has_request(self, request_id: str) -> bool:
        return request_id in self.states.req_id_to_slot

    def token_ids(self, request_id: str) -> list[int]:
        """Ledger ids of the rows in KV, oldest first (after re-anchors: the retained ones)."""
        return self.states.token_ids(self.states.slot_of(request_id))

    def block_ids(self, request_id: str) -> list[int]:
        """The request's reserved KV blocks in logical order."""
        return self.block_table.row(self.states.slot_of(request_id))

    def step(self, inputs: list[StepInput]) -> list[StepResult]:
        """One forward over every input's rows; results in input order.

        Validates everything first, so a bad input raises ValueError with no state changed.
        """
        return self.launch_step(inputs).wait()

    def launch_step(self, inputs: list[StepInput]) -> PendingStep:
        """`step` split in two: queue the step, read its results with `wait()`. On the fast
        path the host is free between the two; the next runner call settles it anyway."""
        self._pending.settle()
        if not inputs:
            return PendingStep.done([])
        slots = self._validate(inputs)
        if self.fast_path is not None:
            sample = partial(self._sample_steps, owned=True)  # rows of the step's own host copy
            self._pending = self.fast_path.launch(inputs, slots, sample)
            return self._pending
        with torch.no_grad():
            batch = self._prepare(inputs, slots)
            embeds = self._gather_embeds(inputs, batch)
            hidden = self.model.forward(embeds, batch.positions, batch.meta, self.kv)
            for inp, slot in zip(inputs, slots):
                self.states.append_tokens(slot, inp.token_ids)
            tokens = self._sample(inputs, slots, batch, hidden)
        results = [self._result(i, inp, batch, hidden, tokens) for i, inp in enumerate(inputs)]
        return PendingStep.done(results)

    @property
    def chain_lengths(self) -> tuple[int, ...]:
        """The decode-chain lengths this runner is configured (and graphed) for; empty where
        it cannot chain (reference path) or chains are off."""
        return () if self.chains is None else self.chains.lengths

    def decode_chain(self, inputs: list[StepInput], length: int) -> list[ChainResult]:
        return self.launch_chain(inputs, length).wait()

    def launch_chain(self, inputs: list[StepInput], length: int) -> PendingChain:
        """`length` decode steps of `inputs` on the device, each step's drawn tokens the next
        step's inputs; results (all `length` tokens per request) on `wait()`, the one host
        wait. Plain decodes only (see `decode_chain.check_chain`); ValueError, no state
        changed, otherwise. Every step is committed: `discard_tail` takes unwanted ones back."""
        self._pending.settle()
        if self.chains is None:
            raise ValueError("decode chains need the fast path (attention_backend 'triton')")
        if not inputs:
            return PendingChain(list)
        slots = self._validate(inputs)
        check_chain(inputs, slots, length, self.states, self.chains.graphs.capacity)
        self.fast_path.publish_admissions()  # chains exist only on the fast path
        chain = self.chains.launch(inputs, slots, length, self.states, self.block_table)
        self._pending = chain
        return chain

    def discard_tail(self, request_id: str, count: int) -> None:
        """Forget the last `count` steps of the request's last decode chain (those after its
        stop): KV length, ledger and drawn history as if it had stopped stepping there."""
        self._pending.settle()
        self.states.discard_tail(self.states.slot_of(request_id), count)

    def num_free_rows(self, request_id: str) -> int:
        """KV rows the request may still add within its reservation."""
        slot = self.states.slot_of(request_id)
        return int(self.states.max_len_np[slot] - self.states.num_computed_tokens_np[slot])

    def _validate(self, inputs: list[StepInput]) -> list[int]:
        request_ids = [inp.request_id for inp in inputs]
        if len(set(request_ids)) != len(request_ids):
            raise ValueError(f"a request appears twice in one step: {request_ids}")
        return [self._validate_one(inp) for inp in inputs]

    def _validate_one(self, inp: StepInput) -> int:
        slot = self.states.slot_of(inp.request_id)
        num_after = int(self.states.num_computed_tokens_np[slot]) + inp.num_rows
        reserved = int(self.states.max_len_np[slot])
        if num_after > reserved:
            raise ValueError(
                f"request {inp.request_id!r}: {inp.num_rows} rows would hold {num_after} "
                f"tokens in KV, more than its reserved max_len {reserved}"
            )
        if inp.embeds is not None and inp.embeds.shape[1] != self.model.hidden_size:
            raise ValueError(
                f"request {inp.request_id!r}: embeds width {inp.embeds.shape[1]} != "
                f"hidden_size {self.model.hidden_size}"
            )
        return slot

    def _prepare(self, inputs: list[StepInput], slots: list[int]) -> InputBatch:
        return build_input_batch(
            slots=slots,
            num_rows=[inp.num_rows for inp in inputs],
            num_computed=[int(self.states.num_computed_tokens_np[s]) for s in slots],
            block_table=self.block_table,
            block_size=self.block_size,
            backend=self.config.attention_backend,
        )

    def _gather_embeds(self, inputs: list[StepInput], batch: InputBatch) -> torch.Tensor:
        """[num_tokens, hidden] in the runner dtype: token embeddings, injected rows overlaid.

        Only rows without injection are embedded, so placeholder ids of injected rows may lie
        outside the embedding table.
        """
        device, dtype = self.config.device, self.config.dtype
        embeds = torch.empty(batch.num_tokens, self.model.hidden_size, dtype=dtype, device=device)
        id_rows: list[int] = []
        ids: list[int] = []
        for batch_idx, inp in enumerate(inputs):
            rows = batch.rows(batch_idx)
            if inp.embeds is not None:
                embeds[rows] = inp.embeds.to(device=device, dtype=dtype)
            else:
                id_rows.extend(range(rows.start, rows.stop))
                ids.extend(inp.token_ids)
        if ids:
            token_tensor = torch.tensor(ids, dtype=torch.int64, device=device)
            row_tensor = torch.tensor(id_rows, dtype=torch.int64, device=device)
            embeds[row_tensor] = self.model.embed_tokens(token_tensor).to(dtype)
        return embeds

    def _sample(
        self,
        inputs: list[StepInput],
        slots: list[int],
        batch: InputBatch,
        hidden: torch.Tensor,
    ) -> list[int | None]:
        """Logits only for the last row of each sampling request; per-request generators."""
        sampled = [i for i, inp in enumerate(inputs) if inp.sample]
        tokens: list[int | None] = [None] * len(inputs)
        if not sampled:
            return tokens
        last_rows = torch.tensor(
            [batch.rows(i).stop - 1 for i in sampled], dtype=torch.int64, device=hidden.device
        )
        logits = self.model.compute_logits(hidden.index_select(0, last_rows))
        processed = self._process(logits, [slots[i] for i in sampled])
        for k, (logits_row, batch_idx) in enumerate(zip(logits, sampled)):
            tokens[batch_idx] = run_alone(self._sample_steps(
                inputs[batch_idx], slots[batch_idx], logits_row, record=k not in processed
            ))  # fmt: skip
        if processed:
            self._finish_processed([sampled[k] for k in processed], slots, tokens)
        return tokens

    def _process(self, logits: torch.Tensor, row_slots: list[int]) -> list[int]:
        """Apply the device processor to the rows it owns, in place; returns their indices."""
        if self.logits_processor is None:
            return []
        rows = [k for k, slot in enumerate(row_slots) if not self.states.samples_on_host(slot)]
        if rows:
            index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
            picked = logits.index_select(0, index)
            self.logits_processor.apply(picked, index.new_tensor([row_slots[k] for k in rows]))
            logits.index_copy_(0, index, picked)
        return rows

    def _finish_processed(
        self, batch_rows: list[int], slots: list[int], tokens: list[int | None]
    ) -> None:
        """Let the processor see (and maybe force) its rows' draws, then record them."""
        assert self.logits_processor is not None
        device = self.kv.data.device
        drawn = torch.tensor([tokens[i] for i in batch_rows], dtype=torch.int64, device=device)
        row_slots = torch.tensor([slots[i] for i in batch_rows], dtype=torch.int64, device=device)
        final = self.logits_processor.update(drawn, row_slots).tolist()
        for i, token in zip(batch_rows, final):
            tokens[i] = token
            self.states.generated[slots[i]].append(token)

    def _sample_steps(self, inp: StepInput, slot: int, logits: torch.Tensor | CompactRow,
                      candidates: TopCandidates | None = None, record: bool = True,
                      owned: bool = False) -> DrawSteps:
        """One row's host sampling, its draw yielded where the hook leaves it (`sample_steps`)."""
        params = self.states.sampling[slot]
        position = int(self.states.num_computed_tokens_np[slot])  # where the token will sit
        # generated: the live history (hooks must not mutate it)
        ctx = SampleContext(inp.request_id, position, self.states.generated[slot], candidates)
        token = yield from sample_steps(logits, params, ctx, self.states.hooks[slot], owned)
        if record:
            self.states.generated[slot].append(token)
        return token

    @staticmethod
    def _result(
        batch_idx: int,
        inp: StepInput,
        batch: InputBatch,
        hidden: torch.Tensor,
        tokens: list[int | None],
    ) -> StepResult:
        rows = batch.rows(batch_idx)
        captured = hidden[rows].to(torch.float32).clone() if inp.capture_hidden else None
        return StepResult(
            request_id=inp.request_id,
            positions=batch.positions_np[rows].tolist(),
            token=tokens[batch_idx],
            hidden=captured,
        )

    def reanchor(self, request_id: str, keep_prefix: int, drop: int) -> None:
        """Drop the `drop` tokens after the first `keep_prefix` and re-RoPE the rest.

        `keep_prefix` and `drop` are any counts. See `reanchor.reanchor_slot`
        for the semantics (StreamingLLM-style; the request keeps its exact reservation).
        """
        self._pending.settle()
        slot = self.states.slot_of(request_id)
        check_reanchor(request_id, keep_prefix, drop, int(self.states.num_computed_tokens_np[slot]))
        with torch.no_grad():
            reanchor_slot(
                slot, keep_prefix, drop, self.states, self.block_table, self.kv,
                self.model.rotary,
            )  # fmt: skip
