"""Code2Wav engine: per-request streaming vocoder state and batched window decoding.

Triton-free and single-threaded: one engine thread calls `submit`, `step` and `release`. Windows
are validated at `submit` (`window_checks`: their content and their (cache_epoch, chunk_seq)
sequence, docs/model_facts.md#code2wav-windows); a rejected one is answered by an error result at
the next `step`. `step` decodes the oldest pending window of up to `max_batch` requests in one
batched forward, least playback slack first (`window_schedule`); a request id appears at most once
per forward, so its later windows wait for later steps. While a reply's first window is announced
(`expect_window`) and not yet here, windows that can wait do (`holding_s`). Every epoch's stream
starts from the engine's prepared default voice, or, when its first window carries REF_AUDIO, from
the voice of that reference (`voice_cache`: prepared once per distinct audio, used by the stream
until its state is dropped); prompt caches are shared, never copied.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from backends.audio.codec_windows import CodecWindow
from backends.contracts.messages import ACTION_STOP, Code2WavRequest
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavStream, Voice
from backends.models.token2wav.batch_buckets import batch_bucket
from backends.stages.voice_cache import DEFAULT_CAPACITY, VoiceCache
from backends.stages.window_checks import WindowSequences, content_error
from backends.stages.window_schedule import (
    FIRST_WINDOW_HOLD_S, Candidate, FirstWindowHints, PlayoutClock, held_for, pick,
)

_LOG = logging.getLogger(__name__)
# Windows per forward: activations (and, without the cache pool, the packed estimator caches)
# grow with it (16-32 streams in one forward ran out of the 36% memory cap on an H200 before
# the pool); 8 pooled windows take ~27 ms there.
DEFAULT_MAX_BATCH = 8

ERROR_INTERNAL = "internal"  # the window's own errors: backends/stages/window_checks.py


@dataclass(frozen=True, slots=True)
class Code2WavResult:
    request_id: str
    chunk_seq: int
    audio: np.ndarray  # [samples] float32, 24 kHz mono; empty on error
    error: str | None = None  # "<code>: <detail>" with a code from the ERROR_* names
    cache_epoch: int = 0
    last_chunk: bool = False  # the turn's audio is complete; the request's state is gone


def request_from_window(request_id: str, window: CodecWindow) -> Code2WavRequest:
    return Code2WavRequest(
        request_id=request_id,
        cache_epoch=window.cache_epoch,
        chunk_seq=window.chunk_seq,
        codes=np.asarray(window.codes, dtype=np.int32),
        num_left_context=window.num_left_context,
        last_chunk=window.last_chunk,
    )


def is_placeholder(request: Code2WavRequest) -> bool:
    """An async-prewarm step: no codes and no sequence number (chunk_seq < 0)."""
    return request.codes.size == 0 and request.chunk_seq < 0


@dataclass(slots=True)
class _State:
    cache_epoch: int
    stream: Token2WavStream
    voice_key: str | None = None  # the cached reference voice the stream uses (None: default)


@dataclass(slots=True)
class Code2WavEngine:
    token2wav: Token2Wav
    voice: Voice  # the default voice, prepared by `token2wav` (its caches belong to that model)
    voice_cache_size: int = DEFAULT_CAPACITY  # reference voices kept prepared (LRU)
    session_voices: bool = True  # False: a valid REF_AUDIO is checked, the default voice speaks
    max_batch: int = DEFAULT_MAX_BATCH
    # > 0: the streams' DiT caches live in a pool of this many slots (Token2Wav.enable_cache_pool,
    # no per-window cache copies); a reply's first window waits while every slot is taken, until
    # a stream ends (its last window or a STOP), oldest waiting reply first
    cache_pool_streams: int = 0
    clock: Callable[[], float] = time.monotonic  # seconds; the playout model's (tests: fake)
    # called with ("first" | "later", seconds) for each window as its forward starts: how long
    # it waited since `submit` (first: chunk_seq 0, a reply's first window); serving: a metric.
    # Time before `submit` (the serving thread's inbox, drained between forwards) is not in it
    on_window_wait: Callable[[str, float], None] | None = None
    first_window_hold_s: float = FIRST_WINDOW_HOLD_S  # how long an announced first window holds
    # request_id -> (arrival, accepted window) not yet decoded, oldest first
    _pending: OrderedDict[str, deque[tuple[float, Code2WavRequest]]] = field(
        init=False, default_factory=OrderedDict
    )
    _playout: dict[str, PlayoutClock] = field(init=False, default_factory=dict)
    _sequences: WindowSequences = field(init=False, default_factory=WindowSequences)
    _states: dict[str, _State] = field(init=False, default_factory=dict)
    _errors: list[Code2WavResult] = field(init=False, default_factory=list)
    voices: VoiceCache = field(init=False)
    hints: FirstWindowHints = field(init=False)
    # Test-only, set by backends/serving/fault_injection.py when fault_injection=on.
    fault_hook: Callable[[str], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.voices = VoiceCache(self.token2wav, self.voice_cache_size)
        self.hints = FirstWindowHints(self.first_window_hold_s)
        if self.cache_pool_streams > 0:
            self.token2wav.enable_cache_pool(self.cache_pool_streams)

    def submit(self, request: Code2WavRequest) -> None:
        if request.action == ACTION_STOP:
            self.release(request.request_id)
            return
        if is_placeholder(request):
            return
        if request.chunk_seq == 0:
            self.hints.arrived(request.request_id)
        flow = self.token2wav.config.flow
        error = (content_error(request, flow.encoder.pre_lookahead_len, flow.vocab_size)
                 or self._sequences.error(request))
        if error is not None:
            self._errors.append(_error_result(request, error))
            return
        self._sequences.accept(request)
        self._pending.setdefault(request.request_id, deque()).append((self.clock(), request))

    def expect_window(self, request_id: str) -> None:
        """A reply's first window for `request_id` is on its way (its Talker has started)."""
        self.hints.announce(request_id, self.clock())

    def holding_s(self) -> float:
        """How long pending windows wait for an announced first window (0: `step` decodes)."""
        now = self.clock()
        return held_for(self._candidates(), now, self.hints.remaining(now))

    def step(self) -> list[Code2WavResult]:
        """Decode the oldest pending window of up to `max_batch` requests (least playback
        slack first: backends/stages/window_schedule.py) in one forward; also return the errors
        of windows rejected since the last step."""
        results, self._errors = self._errors, []
        batch, windows = [], []
        start = self.clock()
        for arrival, request in [self._pop_oldest(request_id) for request_id in self._schedule()]:
            if self.on_window_wait is not None:
                self.on_window_wait("first" if request.chunk_seq == 0 else "later", start - arrival)
            window = self._prepare(request, results)
            if window is not None:
                batch.append(request)
                windows.append(window)
        if not batch:
            return results
        try:
            decoded = self.token2wav.decode(windows)
        except Exception as exc:  # the forward is shared: every stream in it is suspect
            _LOG.exception("code2wav forward failed")
            return results + self._fail_batch(batch, exc)
        now = self.clock()
        for request, audio in zip(batch, decoded):
            if request.last_chunk:
                self._drop_state(request.request_id)
            else:
                seconds = audio.shape[-1] / self.token2wav.sample_rate
                self._playout.setdefault(request.request_id, PlayoutClock()).sent(now, seconds)
            results.append(Code2WavResult(
                request.request_id, request.chunk_seq, audio,
                cache_epoch=request.cache_epoch, last_chunk=request.last_chunk,
            ))
        return results

    def _prepare(self, request: Code2WavRequest, errors: list[Code2WavResult]) -> StreamWindow | None:
        """The request's window for this forward; a failure ends that request only."""
        try:
            if self.fault_hook is not None:
                self.fault_hook(request.request_id)
            return StreamWindow(self._stream_for(request), request.codes, request.last_chunk)
        except Exception as exc:  # request-scoped: the other windows of the step go on
            _LOG.exception("code2wav request %s failed", request.request_id)
            self.release(request.request_id)
            errors.append(_error_result(request, f"{ERROR_INTERNAL}: {type(exc).__name__}: {exc}"))
            return None

    def resource_counts(self) -> dict[str, int]:
        """What the engine holds (leak checks; published as gauges by the serving layer)."""
        return {"codec_states": len(self._states), "codec_sequences": len(self._sequences),
                "codec_pending": self.num_pending(), "codec_slot_waits": self.num_waiting_for_slot(),
                "voice_cache": len(self.voices),
                "voice_users": self.voices.num_users(), **self.token2wav.graph_counts()}

    def release(self, request_id: str) -> None:
        """Drop the request's state and pending windows (idempotent)."""
        self._pending.pop(request_id, None)
        self._sequences.drop(request_id)
        self.hints.arrived(request_id)
        self._drop_state(request_id)

    def _drop_state(self, request_id: str) -> None:
        self._playout.pop(request_id, None)
        state = self._states.pop(request_id, None)
        if state is not None:
            self.token2wav.release_stream(state.stream)  # its cache pool slot, if any
        if state is not None and state.voice_key is not None:
            self.voices.release(state.voice_key)

    def num_states(self) -> int:
        return len(self._states)

    def num_pending(self) -> int:
        return sum(len(queue) for queue in self._pending.values())

    def _fail_batch(self, batch: list[Code2WavRequest], exc: Exception) -> list[Code2WavResult]:
        """Half-updated streams cannot continue: release them, answer every window."""
        for request in batch:
            self.release(request.request_id)
        error = f"{ERROR_INTERNAL}: {type(exc).__name__}: {exc}"
        return [_error_result(request, error) for request in batch]

    def _schedule(self) -> list[str]:
        """The requests whose oldest window goes into this forward (none while they wait for
        an announced first window)."""
        candidates, now = self._candidates(), self.clock()
        if held_for(candidates, now, self.hints.remaining(now)) > 0.0:
            return []
        return pick(candidates, now, self.max_batch, fill_to=batch_bucket)

    def _candidates(self) -> list[Candidate]:
        """The pending requests that can decode now: all but the replies beyond the free slots."""
        no_audio = PlayoutClock()
        return [Candidate(request_id, self._pending[request_id][0][0],
                          self._playout.get(request_id, no_audio).audio_end)
                for request_id in self._runnable()]

    def _runnable(self) -> list[str]:
        pool = self.token2wav.cache_pool
        free = pool.num_free() if pool is not None else len(self._pending)
        runnable = []
        for request_id in self._pending:  # in arrival order: the oldest waiting reply first
            if request_id not in self._states:  # its next window starts a stream: takes a slot
                if free == 0:
                    continue
                free -= 1
            runnable.append(request_id)
        return runnable

    def has_work(self) -> bool:
        """A step would decode or answer something (replies waiting for a slot alone: no)."""
        return bool(self._errors) or bool(self._runnable())

    def num_waiting_for_slot(self) -> int:
        """Requests whose first window waits for a free cache-pool slot."""
        return len(self._pending) - len(self._runnable())

    def _pop_oldest(self, request_id: str) -> tuple[float, Code2WavRequest]:
        """-> (its arrival, the request's oldest pending window)."""
        queue = self._pending[request_id]
        oldest = queue.popleft()
        if not queue:
            del self._pending[request_id]
        return oldest

    def _stream_for(self, request: Code2WavRequest) -> Token2WavStream:
        """The request's stream; a new epoch starts from fresh state (the old one is dropped)."""
        state = self._states.get(request.request_id)
        if state is None or state.cache_epoch != request.cache_epoch:
            self._drop_state(request.request_id)
            state = self._states[request.request_id] = self._new_state(request)
        return state.stream

    def _new_state(self, request: Code2WavRequest) -> _State:
        if request.ref_audio.size == 0 or not self.session_voices:
            return _State(request.cache_epoch, self.token2wav.new_stream(self.voice))
        key, voice = self.voices.acquire(request.ref_audio)
        try:
            return _State(request.cache_epoch, self.token2wav.new_stream(voice), key)
        except BaseException:
            self.voices.release(key)
            raise


def _error_result(request: Code2WavRequest, error: str) -> Code2WavResult:
    return Code2WavResult(
        request.request_id, request.chunk_seq, np.zeros(0, dtype=np.float32), error,
        cache_epoch=request.cache_epoch, last_chunk=request.last_chunk,
    )
