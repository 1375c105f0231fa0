"""The Thinker engine: many duplex sessions batched on one runner.

Single-threaded: the serving layer calls every method from its one engine thread. One
`step()` is one runner step over all ready work of all sessions: the appends (prefill rows) of
some (a long one in chunks: backends/thinker/prefill_chunks.py) and the decodes of others in one
mixed batch. While it runs on the GPU, the engine thread's new commands are taken and the
appends of sessions outside the step are laid out, so their host work is off the next step's
path. A unit decodes until its chunk terminator (at most 20 tokens), sampled but not
forwarded and re-injected at the head of the session's next append.

Failures are session-scoped: an exception while preparing, sampling or finishing one session
closes that session's sinks with an error and frees its state; other sessions keep running.
A session that outgrows its context ends with `context_length_exceeded` unless its window
(backends/thinker/context_window.py) makes room before an append: a `basic` cut re-anchors
the KV in place on the runner, a `context` drop re-prefills a rebuilt prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.contracts.errors import StageError, StageFailure
from backends.contracts.messages import ACTION_STOP, ThinkerRequest
from backends.contracts.sink import ResponseSink
from backends.models.qwen3 import Qwen3ForCausalLM
from backends.runner.hidden_ledger import HiddenLedger
from backends.runner.model_runner import ModelRunner
from backends.runner.types import AdmissionError, RunnerConfig, SamplingParams, StepInput, StepResult
from backends.thinker.append_fit import check_context, fit_window
from backends.thinker.append_request import check_append, policy_config, window_mode
from backends.thinker.context_window import WINDOW_MODES, ContextWindow, WindowConfig
from backends.thinker.duplex_policy import DuplexPolicy
from backends.thinker.policy_masks import PolicyIds, policy_runner_config
from backends.thinker.prompt_layout import PromptLayout
from backends.thinker.session_state import QueuedAppend, ThinkerSession, UnitEncoder
from backends.thinker.unit_batch import Encoded, encode_pending_units, streaming_encoder_factory

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ThinkerEngineConfig:
    max_context_tokens: int = 0  # per-session KV reservation; 0 -> the runner's max_model_len
    window_mode: str = "off"  # for sessions that do not choose: off | basic | context
    window: WindowConfig = WindowConfig()  # watermarks and limits of the basic/context modes
    ledger_rows: int = 64  # captured hidden rows kept per session (a unit forwards <= 19)
    prefill_chunk_rows: int = 0  # most prefill rows of a session per step (0: no limit; factory)
    # the policy option for sessions that do not choose: listen on a silent unit with nothing
    # to answer (on for random-weight profiles, whose decisions mean nothing; factory)
    listen_when_silent: bool = False

    def __post_init__(self) -> None:
        if min(self.max_context_tokens, self.ledger_rows - 1, self.prefill_chunk_rows) < 0:
            raise ValueError(
                f"max_context_tokens and prefill_chunk_rows must be >= 0 and ledger_rows >= 1, "
                f"got {self.max_context_tokens}, {self.prefill_chunk_rows}, {self.ledger_rows}"
            )
        if self.window_mode not in WINDOW_MODES:
            raise ValueError(f"window_mode {self.window_mode!r} is not one of {WINDOW_MODES}")


class ThinkerEngine:
    def __init__(
        self,
        model: Qwen3ForCausalLM,
        audio_encoder_model: AudioEncoderModel | None,
        tokenizer: TextTokenizer,
        special_tokens: SpecialTokens,
        runner_config: RunnerConfig,
        config: ThinkerEngineConfig | None = None,
        encoder_factory: Callable[[], UnitEncoder] | None = None,
        default_voice: np.ndarray | None = None,  # [n] float32 16 kHz: the Thinker's reference
    ) -> None:
        self.model = model
        self.default_voice = default_voice
        self.tokenizer = tokenizer
        self.special = special_tokens
        self.config = config or ThinkerEngineConfig()
        runner_config = policy_runner_config(runner_config, tokenizer.vocab_size, special_tokens)
        self.runner = ModelRunner(model, runner_config)
        self.runner_config = runner_config
        self.layout = PromptLayout(tokenizer, special_tokens)
        self.encoder_factory = encoder_factory or streaming_encoder_factory(audio_encoder_model)
        self.max_len = _max_len(model, runner_config, self.config)
        # Never sampled: the tokenizer's bad_token_ids (as the official duplex decoder) and the
        # embedding rows past the tokenizer's vocabulary (padding).
        padding = range(tokenizer.vocab_size, model.config.vocab_size)
        self.bad_token_ids = (*getattr(tokenizer, "bad_token_ids", ()), *padding)
        # NOTE: TextTokenizer does not list its other added tokens yet; EOS is the one known.
        eos = tokenizer.eos_token_id
        self.extra_special_ids = () if eos is None else (eos,)
        self.policy_ids = PolicyIds(special_tokens, self.bad_token_ids, self.extra_special_ids)
        self._sessions: dict[str, ThinkerSession] = {}  # owner: the engine thread
        # The engine thread's command drain, run while a step is on the GPU (EngineThread).
        self._in_flight_drain: Callable[[], None] | None = None
        # Test-only, set by backends/serving/fault_injection.py when fault_injection=on.
        self.fault_hook: Callable[[str], None] | None = None

    # ---- requests --------------------------------------------------------------------------

    def submit(self, request: ThinkerRequest, sink: ResponseSink) -> None:
        """Queue one append (or act on a stop); every path ends with the sink closed."""
        if request.action == ACTION_STOP:
            self.stop(request.request_id)
            sink.close()
            return
        try:
            check_append(request)
            session = self._session_for(request)
        except StageFailure as failure:
            sink.close(failure.error)
            return
        session.queue.append(QueuedAppend(request, sink))
        session.last_seq = request.seq

    def stop(self, request_id: str) -> None:
        """Free the request's runner slot, encoder cache and state; idempotent. An unknown id
        touches nothing (edge case 1: a stop for a never-prefilled request)."""
        session = self._sessions.get(request_id)
        if session is not None:
            self._end(session, StageError("cancelled", f"request {request_id!r} was stopped"))

    def has_work(self) -> bool:
        return any(session.has_work for session in self._sessions.values())

    def num_sessions(self) -> int:
        return len(self._sessions)

    def resource_counts(self) -> dict[str, int]:
        """What the engine holds (leak checks; published as gauges by the serving layer)."""
        return {"requests": len(self._sessions), "runner_requests": len(self.runner.states.req_id_to_slot),
                "kv_free_blocks": self.runner.num_free_blocks(), "kv_blocks": self.runner.config.num_blocks}

    def attach_in_flight_drain(self, drain: Callable[[], None]) -> None:
        """`drain()` runs the engine thread's pending commands (EngineThread calls this)."""
        self._in_flight_drain = drain

    # ---- the step --------------------------------------------------------------------------

    def step(self) -> None:
        """One runner step over every session with work, then deliver finished units."""
        batch = list(self._ready_inputs())
        if not batch:
            return
        try:
            pending = self.runner.launch_step([inp for _, inp in batch])
            self._while_in_flight({id(session) for session, _ in batch})
            results = pending.wait()
        except Exception as err:  # noqa: BLE001 - the batch is lost, the engine stays up
            logger.exception("thinker runner step failed")
            for session, _ in batch:
                self._end(session, StageError("internal", f"thinker step failed: {err}"))
            return
        for (session, inp), result in zip(batch, results):
            if self._sessions.get(session.request_id) is not session:
                continue  # stopped while the step was in flight: its sinks are closed
            self._guarded(session, lambda s=session, i=inp, r=result: self._deliver(s, i, r))

    def _ready_inputs(self) -> Iterator[tuple[ThinkerSession, StepInput]]:
        encoded = encode_pending_units(self._sessions.values())  # one batched audio encode
        for session in list(self._sessions.values()):
            if session.has_work:
                work = partial(self._next_input, session, encoded.get(session.request_id))
                inp = self._guarded(session, work)
                if inp is not None:
                    yield session, inp

    def _next_input(self, session: ThinkerSession, encoded: Encoded | None = None) -> StepInput:
        if self.fault_hook is not None:
            self.fault_hook(session.request_id)
        if session.active is None:
            self._activate(session, encoded)
        embed = self.model.embed_tokens
        return session.next_input(embed, self.runner_config.device, self.runner_config.dtype)

    def _activate(self, session: ThinkerSession, encoded: Encoded | None = None) -> None:
        """Lay out the session's next queued append (encode, window, context check)."""
        rows = session.activate(encoded).rows
        assert rows is not None  # fresh from activate()
        fit_window(self.runner, session, rows, session.max_len)
        check_context(self.runner, session, rows.num_rows, session.max_len)

    def _while_in_flight(self, busy: set[int]) -> None:
        """The GPU runs a step: accept the commands that arrived meanwhile and lay out the next
        append of every session outside the step (mel, encoder launch, rows), so the next
        step does not wait for that host work. A session starting here, or a window restart
        or cut, settles the step first (runner state changes): it only loses the overlap."""
        if self._in_flight_drain is not None:
            self._in_flight_drain()
        idle = [s for s in self._sessions.values() if id(s) not in busy and s.active is None and s.queue]
        encoded = encode_pending_units(idle)
        for session in idle:
            self._guarded(session, partial(self._activate, session, encoded.get(session.request_id)))

    def _deliver(self, session: ThinkerSession, inp: StepInput, result: StepResult) -> None:
        unit = session.consume(inp, result)
        active = session.active
        assert active is not None  # consume() took this step's result for it
        if unit is None and (active.rows is not None or not active.is_setup):
            return  # still prefilling, or decoding
        session.active = None  # the sink is closed here, never again by _end
        if unit is None:  # a setup append answers with no unit
            return active.sink.close()
        try:
            active.sink.finish(unit)
        except Exception as err:
            _close_quietly(active.sink, StageError("internal", f"delivering a unit failed: {err}"))
            raise

    # ---- session life ----------------------------------------------------------------------

    def _session_for(self, request: ThinkerRequest) -> ThinkerSession:
        session = self._sessions.get(request.request_id)
        if request.seq == 0:
            if session is not None:
                raise StageFailure(
                    "invalid_argument", f"request {request.request_id!r} already started"
                )
            return self._start_session(request)
        if session is None:
            raise StageFailure(
                "invalid_argument",
                f"unknown request {request.request_id!r} (never started, stopped or ended)",
            )
        if request.seq <= session.last_seq:
            raise StageFailure(
                "invalid_argument",
                f"append seq {request.seq} after seq {session.last_seq} is out of order",
            )
        return session

    def _start_session(self, first: ThinkerRequest) -> ThinkerSession:
        policy = DuplexPolicy(
            self.special, self.tokenizer, policy_config(first, self.config.listen_when_silent), self.bad_token_ids,
            extra_special_ids=self.extra_special_ids, seed=first.seed, ids=self.policy_ids,
            eos_id=self.tokenizer.eos_token_id)
        ledger = HiddenLedger(self.model.hidden_size, self.config.ledger_rows)
        # a session's own limit (START max_kv_tokens) within the engine's reservation
        max_len = min(first.max_kv_tokens, self.max_len) if first.max_kv_tokens > 0 else self.max_len
        window = ContextWindow(window_mode(first, self.config.window_mode), self.config.window, max_len)
        encoder = self.encoder_factory()
        session = ThinkerSession(first.request_id, encoder, policy, self.layout, self.tokenizer,
                                 ledger, window, self.config.prefill_chunk_rows, max_len)
        try:
            self.runner.add_request(first.request_id, SamplingParams(seed=first.seed), session.hook, max_len)
        except AdmissionError as err:
            raise StageFailure("resource_exhausted", str(err)) from err
        try:
            session.setup(first, self.default_voice)
        except Exception as err:  # noqa: BLE001 - answered as this request's error
            logger.exception("thinker session setup of %r failed", first.request_id)
            self.runner.free_request(first.request_id)
            session.close()
            raise StageFailure("internal", f"session setup failed: {err}") from err
        self._sessions[first.request_id] = session
        return session

    def _guarded(self, session: ThinkerSession, work: Callable[[], object]) -> object | None:
        """Run one session's work; a failure ends only that session."""
        try:
            return work()
        except StageFailure as failure:
            self._end(session, failure.error)
        except Exception as err:  # noqa: BLE001 - session-scoped isolation, logged in full
            logger.exception("thinker session %r failed", session.request_id)
            self._end(session, StageError("internal", f"thinker session failed: {err}"))
        return None

    def _end(self, session: ThinkerSession, error: StageError) -> None:
        """Close every open sink of the session with `error` and free it, exactly once."""
        if self._sessions.pop(session.request_id, None) is None:
            return
        sinks = [queued.sink for queued in session.queue]
        if session.active is not None:
            sinks.insert(0, session.active.sink)
        self.runner.free_request(session.request_id)
        session.close()
        for sink in sinks:
            _close_quietly(sink, error)


def _close_quietly(sink: ResponseSink, error: StageError) -> None:
    try:
        sink.close(error)
    except Exception:  # noqa: BLE001 - a broken sink must not stop the other closes
        logger.exception("closing a thinker sink failed")


def _max_len(model: Qwen3ForCausalLM, runner_config: RunnerConfig, config: ThinkerEngineConfig) -> int:
    configured = config.max_context_tokens or runner_config.max_model_len
    return min(model.config.max_position_embeddings, configured, runner_config.max_model_len)

