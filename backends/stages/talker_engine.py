"""The Talker stage engine: Thinker handoffs (conditions) in, streamed codec frames out.

Single-threaded: the serving layer calls `submit`, `stop`, `has_work` and `step` from its one
engine thread. Each `step` projects the conditions that arrived since the last one (one batched
pass), then runs ONE runner forward over every request with an active chunk: the prefill of a
newly started condition for some, a one-frame decode for the others; or, once every chunk is
decoding, a decode chain of K frames each (`backends.talker.chain_plan`).

Per request id (one session epoch) the engine keeps one runner request whose KV grows with every
condition (docs/model_facts.md#talker-context-and-rollover): a turn start replaces the prompt, a
condition that would not fit with its reserve rolls it over (`backends.talker.rollover`). Each
request reserves its whole Talker context in KV when admitted, so the runner never preempts
(docs/architecture.md edge case 10); a reservation that fails is `resource_exhausted`.

The chunk policy runs on the device where the runner samples on the device (its fast path):
one `TalkerPolicyTable` is the runner's logits processor and each request holds a row of it
(`backends.talker.device_policy`); elsewhere each request gets the host hook `PolicyGuard`.
A chain's codes are taken as K steps' would be (`chain_harvest`); draws past a chunk's end dropped.

Errors are request-scoped: a bad condition or an exception while handling one request closes
that request's sinks with a StageError and frees its state; other requests go on. `stop`
closes the request's open sinks with StageError("cancelled"): a stopped chunk is told apart
from a finished one (which always ends with a `finished=True` group).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from backends.contracts.errors import StageError, StageFailure
from backends.contracts.messages import ACTION_RUN, ACTION_STOP, TalkerCodes, TalkerRequest
from backends.contracts.sink import ResponseSink
from backends.models.talker import TalkerModel
from backends.models.talker_policy import ChunkKind, TalkerChunkPolicy, TalkerSamplingConfig
from backends.runner.model_runner import ModelRunner
from backends.runner.types import AdmissionError, ChainResult, RunnerConfig, StepInput, StepResult
from backends.talker import chain_harvest as harvest
from backends.talker.chain_plan import chain_config, chain_length
from backends.talker.condition import Condition, check_condition, project_queued
from backends.talker.device_policy import make_policy_table, new_chunk_policy
from backends.talker.ended_requests import EndedRequests
from backends.talker.failures import close_quietly, internal_error
from backends.talker.request_state import ActiveChunk, TalkerStream, check_next_seq
from backends.talker.rollover import ChunkRecord, PromptKind, embed_codes, plan_prompt

_LOG = logging.getLogger(__name__)


class TalkerEngine:
    def __init__(
        self,
        model: TalkerModel,
        runner_config: RunnerConfig,
        sampling: TalkerSamplingConfig | None = None,
        policy_factory: Callable[[], TalkerChunkPolicy] | None = None,
        device_policy: bool | None = None,  # None: on the device where the runner can
        chain_lengths: tuple[int, ...] | None = None,  # None: chain_plan's choice; () off
    ) -> None:
        self._model = model
        self._device = torch.device(runner_config.device)
        self._sampling = sampling or TalkerSamplingConfig()
        self._eos_id = model.config.eos_id
        self._policy_factory = policy_factory or partial(TalkerChunkPolicy, self._sampling,
                                                         eos_id=self._eos_id)  # fmt: skip
        self._policy_table = make_policy_table(device_policy, runner_config, self._sampling,
                                               self._eos_id, bool(policy_factory))  # fmt: skip
        runner_config = chain_config(runner_config, chain_lengths, self._policy_table is not None)
        self._runner = ModelRunner(model, runner_config, self._policy_table)
        # Talker context = min(runner max_model_len, tts max_position_embeddings)
        # (docs/model_facts.md#talker-context-and-rollover).
        self.context = min(runner_config.max_model_len, model.config.max_position_embeddings)
        self._streams: dict[str, TalkerStream] = {}
        self._embed_codes = partial(embed_codes, model, self._device)
        self._ended = EndedRequests()
        # Test-only, set by backends/serving/fault_injection.py when fault_injection=on.
        self.fault_hook: Callable[[str], None] | None = None

    @property
    def runner(self) -> ModelRunner:
        return self._runner

    def has_work(self) -> bool:
        return any(stream.has_work() for stream in self._streams.values())

    def num_requests(self) -> int:
        return len(self._streams)

    def resource_counts(self) -> dict[str, int]:
        """What the engine holds (leak checks; published as gauges by the serving layer)."""
        runner = self._runner
        return {"requests": len(self._streams), "runner_requests": len(runner.states.req_id_to_slot),
                "kv_free_blocks": runner.num_free_blocks(), "kv_blocks": runner.config.num_blocks}

    def submit(self, request: TalkerRequest, sink: ResponseSink) -> None:
        """Accept one condition; its frames reach `sink` from later `step` calls."""
        if request.action == ACTION_STOP:
            self.stop(request.request_id)
            sink.close()
            return
        late = None
        if request.request_id not in self._streams:
            late = self._ended.refusal(request.request_id, request.condition_seq)
        if late is not None:
            close_quietly(sink, late)
            return
        try:
            self._accept(request, sink)
        except StageFailure as failure:
            self._reject(request.request_id, sink, failure.error)
        except Exception as exc:  # request-scoped: the engine thread must survive
            _LOG.exception("talker request %s: submit failed", request.request_id)
            self._reject(request.request_id, sink, internal_error(request.request_id, exc))

    def stop(self, request_id: str) -> None:
        """End a request: free its KV and state, close its open sinks as cancelled.

        Idempotent; an unknown id touches nothing. Later conditions of a stopped request are
        refused with "cancelled" unless they restart it at condition_seq 0 (`EndedRequests`).
        """
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self._runner.free_request(request_id)
        error = StageError("cancelled", f"talker request {request_id} was stopped")
        self._ended.add(request_id, error)
        for sink in stream.open_sinks():
            close_quietly(sink, error)

    def step(self) -> None:
        """Project new conditions, start queued ones, run one forward (or one decode chain)
        over all active chunks, stream frames."""
        self._project_queued()
        inputs = self._collect_inputs()
        if not inputs:
            return
        length = self._chain_length(inputs)
        try:
            results = (self._runner.decode_chain(inputs, length) if length > 1
                       else self._runner.step(inputs))  # fmt: skip
        except Exception as exc:  # the forward is shared: every request in it is suspect
            _LOG.exception("talker runner step failed")
            for step_input in inputs:
                self._fail(step_input.request_id, internal_error(step_input.request_id, exc))
            return
        for result in results:
            self._guarded(result.request_id, self._on_result, result)

    # -- submit ------------------------------------------------------------------------------

    def _accept(self, request: TalkerRequest, sink: ResponseSink) -> None:
        if request.action != ACTION_RUN:
            raise StageFailure("invalid_argument", f"unknown talker action {request.action!r}")
        stream = self._streams.get(request.request_id)
        check_next_seq(stream, request)
        condition = check_condition(self._model, request, sink)
        if stream is None:
            policy = new_chunk_policy(self._policy_table, self._policy_factory, self._eos_id)
            stream = TalkerStream(request.request_id, policy)
            self._admit(stream, request.seed)
            self._streams[request.request_id] = stream
        stream.last_seq = request.condition_seq
        stream.queue.append(condition)

    def _admit(self, stream: TalkerStream, seed: int) -> None:
        params = dataclasses.replace(self._sampling.to_sampling_params(), seed=seed)
        try:
            hook = stream.hook.runner_hook
            self._runner.add_request(stream.request_id, params, hook, self.context)
        except AdmissionError as exc:
            raise StageFailure("resource_exhausted", str(exc)) from exc
        stream.hook.attach(self._runner.states.slot_of(stream.request_id))

    def _reject(self, request_id: str, sink: ResponseSink, error: StageError) -> None:
        """A condition failed on arrival: it ends the whole request (its seq is now lost)."""
        close_quietly(sink, error)
        self._fail(request_id, error)

    # -- step --------------------------------------------------------------------------------

    def _project_queued(self) -> None:
        try:
            project_queued(self._model, self._streams.values(), self._device)
        except Exception as exc:  # shared work: every request waiting on it is suspect
            _LOG.exception("talker condition projection failed")
            for rid in [r for r, s in self._streams.items() if any(c.needs_rows for c in s.queue)]:
                self._fail(rid, internal_error(rid, exc))

    def _collect_inputs(self) -> list[StepInput]:
        inputs = []
        for stream in list(self._streams.values()):
            self._guarded(stream.request_id, self._activate, stream)
            if stream.request_id in self._streams and stream.active is not None:
                inputs.append(stream.active.next_input)
        return inputs

    def _chain_length(self, inputs: list[StepInput]) -> int:
        chunks = [self._streams[step_input.request_id].active for step_input in inputs]
        rooms = [self._runner.num_free_rows(step_input.request_id) for step_input in inputs]
        return chain_length(self._runner.chain_lengths, inputs, chunks, rooms)

    def _activate(self, stream: TalkerStream) -> None:
        """Start the next queued condition unless a chunk is already running."""
        while stream.active is None and stream.queue:
            condition = stream.queue[0]  # popped only once started: a failure still owes a close
            if condition.kind is ChunkKind.EMPTY:
                self._finish_empty(stream, condition)
            else:
                stream.active = self._start_chunk(stream, condition)
            stream.queue.popleft()

    def _start_chunk(self, stream: TalkerStream, condition: Condition) -> ActiveChunk:
        request = condition.request
        plan = plan_prompt(
            condition.embeds,
            condition.reserve,
            turn_start=request.turn_start,
            num_computed=self._runner.num_tokens(stream.request_id),
            last_chunk=stream.last_chunk,
            context=self.context,
            embed_codes=self._embed_codes,
        )
        if plan.kind is not PromptKind.APPEND:
            self._readmit(stream, request.seed)
        stream.hook.begin_chunk(condition.kind)
        step_input = StepInput(stream.request_id, plan.token_ids, plan.embeds)
        return ActiveChunk(condition, step_input)

    def _finish_empty(self, stream: TalkerStream, condition: Condition) -> None:
        """An empty handoff ends at once (forced EOS): no frames, nothing forwarded."""
        if condition.request.turn_start:
            # It still opens a new turn: later conditions must not extend the old prompt.
            self._readmit(stream, condition.request.seed)
        request, frames = condition.request, np.zeros((0,), dtype=np.int32)  # [0] int32
        condition.sink.finish(TalkerCodes(request.request_id, request.condition_seq, frames, True))

    def _readmit(self, stream: TalkerStream, seed: int) -> None:
        """Drop the request's KV and start again from position 0 (same hook, same history)."""
        stream.hook.detach(self._runner.states.slot_of(stream.request_id))
        self._runner.free_request(stream.request_id)
        stream.last_chunk = None
        self._admit(stream, seed)

    def _on_result(self, result: StepResult | ChainResult) -> None:
        """A step's code, or a chain's codes until the chunk ends (the rest of the chain is
        dropped from the runner, as if the request had stopped stepping)."""
        tokens = result.tokens if isinstance(result, ChainResult) else [result.token]
        stream = self._streams[result.request_id]
        hook, take = self.fault_hook, self._take
        used = (take(stream, tokens) if hook is None else
                harvest.take_one_by_one(stream, tokens, take, self._is_alive, hook))
        if used < len(tokens) and self._streams.get(stream.request_id) is stream:
            self._runner.discard_tail(stream.request_id, len(tokens) - used)

    def _take(self, stream: TalkerStream, tokens: list[int | None]) -> int:
        """Take the draws the chunk keeps in one go; returns how many were used."""
        chunk = harvest.active_chunk(stream, tokens[0])
        kept = harvest.codes_before_end(tokens, self._eos_id, chunk.max_codes - len(chunk.codes))
        is_alive = partial(self._is_alive, stream)  # a sink may stop the request in a send
        if not harvest.take_codes(chunk, tokens[:kept], is_alive) or kept == len(tokens):
            chunk.next_input = StepInput(stream.request_id, [tokens[kept - 1]])  # its emb_code
            return kept
        self._finish_chunk(stream, chunk)
        return kept + 1

    def _is_alive(self, stream: TalkerStream) -> bool:
        return self._streams.get(stream.request_id) is stream

    def _finish_chunk(self, stream: TalkerStream, chunk: ActiveChunk) -> None:
        sink = chunk.condition.sink
        sink.finish(chunk.take_group(finished=True))
        stream.active = None
        stream.last_chunk = ChunkRecord(chunk.condition.embeds, tuple(chunk.codes))

    # -- failures ----------------------------------------------------------------------------

    def _guarded(self, request_id: str, action: Callable[..., None], *args: object) -> None:
        """Run one request's work; any failure ends that request only."""
        try:
            action(*args)
        except StageFailure as failure:
            self._fail(request_id, failure.error)
        except Exception as exc:  # request-scoped: the engine thread must survive
            _LOG.exception("talker request %s failed", request_id)
            self._fail(request_id, internal_error(request_id, exc))

    def _fail(self, request_id: str, error: StageError) -> None:
        self._ended.add(request_id, error)
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self._runner.free_request(request_id)
        for sink in stream.open_sinks():
            close_quietly(sink, error)

