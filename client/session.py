"""One duplex session over one tritonclient gRPC stream (one stream per client object).

Threading: tritonclient calls `_on_response` on its stream thread; that callback only stamps
the arrival time and enqueues. Everything else (demultiplexing, parsing, session state) is
owned by the single thread that drives the session. Every wait has a deadline and raises
`DuplexTimeout` when it passes: a server that never sends a FINAL cannot hang the client.
"""

from __future__ import annotations

import enum
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import InferenceServerClient, InferInput, InferResult
from tritonclient.utils import InferenceServerException

from client.demux import DOWNLINK_REQUEST_ID, Arrival, DownlinkDemux
from client.errors import DuplexStateError, DuplexStreamError, DuplexTimeout
from client.events import AudioDelta, DuplexEvent, ErrorEvent, SessionCreated
from client.params import SessionParams
from client.stream_close import stop_stream

MODEL_NAME = "duplex"
# The header a session-affinity load balancer hashes on (deploy/README.md "Scale-out").
AFFINITY_HEADER = "x-session-id"
INPUT_SAMPLE_RATE = 16000
STREAM_ERROR_WAIT_S = 2.0  # how long a refused send waits for the broken stream's own error
# How often a session moves its downlink to a fresh request: the server keeps per open request
# what it answered on it until its FINAL (docs/triton_behaviours.md), ~4 MiB a minute of audio.
DOWNLINK_MOVE_S = 120.0
_EMPTY_PCM = np.zeros(0, dtype=np.int16)  # [0] int16: control-only requests


class StreamClient(Protocol):
    """The part of `tritonclient.grpc.InferenceServerClient` that a session uses."""

    def is_model_ready(self, model_name: str, client_timeout: float | None = None,
                       **kwargs: Any) -> bool: ...

    def start_stream(self, callback: Callable[..., None], **kwargs: Any) -> None: ...

    def async_stream_infer(
        self, model_name: str, inputs: list[InferInput], **kwargs: Any
    ) -> None: ...

    def stop_stream(self, cancel_requests: bool = False) -> None: ...

    def close(self) -> None: ...


class _Phase(enum.Enum):
    NEW = "new"
    OPEN = "open"
    ENDED = "ended"
    CLOSED = "closed"


class DuplexSession:
    """A client session of the `duplex` model: uplink requests in, downlink events out."""

    def __init__(self, client: StreamClient, session_id: str | int, *, model_name: str = MODEL_NAME,
                 headers: dict[str, str] | None = None, downlink_move_s: float | None = DOWNLINK_MOVE_S):
        if isinstance(session_id, bool) or session_id in (0, ""):
            raise ValueError(
                f"session_id must be a non-empty string or a non-zero int, got {session_id!r}"
            )
        self._client = client
        self.session_id = session_id
        self.model_name = model_name
        # gRPC metadata of every call: e.g. {AFFINITY_HEADER: session id} behind a load balancer
        self._headers = {str(k): str(v) for k, v in (headers or {}).items()}
        self.started_s: float | None = None  # time.monotonic() when START was sent
        self._inbox: queue.Queue[Arrival] = queue.Queue()
        self._demux = DownlinkDemux(session_id)
        self._phase = _Phase.NEW
        self._num_uplink = 0
        self._downlink_move_s = downlink_move_s  # None: the START request carries it to the end
        self._downlink_since_s = 0.0  # when the downlink last moved (or START)
        self.num_downlink_moves = 0
        self._admitted = False  # session.created arrived
        self._refused = False  # START answered without session.created
        self._chunks: list[tuple[str, np.ndarray]] = []  # (response_id, [n] int16 24 kHz)

    @classmethod
    def connect(cls, url: str, session_id: str | int | None = None, *, model_name: str = MODEL_NAME,
                affinity_header: str | None = None,
                downlink_move_s: float | None = DOWNLINK_MOVE_S) -> DuplexSession:
        """A session on its own `InferenceServerClient` (`url` is host:port of gRPC).
        `affinity_header` (e.g. AFFINITY_HEADER) sends the session id in that header, which a
        load balancer hashes on to keep every stream of the session on one replica."""
        sid = session_id if session_id is not None else f"client-{uuid.uuid4().hex[:12]}"
        headers = {affinity_header: str(sid)} if affinity_header else None
        return cls(InferenceServerClient(url=url), sid, model_name=model_name, headers=headers,
                   downlink_move_s=downlink_move_s)

    def _header_kwargs(self) -> dict[str, Any]:
        return {"headers": dict(self._headers)} if self._headers else {}

    def check_ready(self, timeout_s: float) -> None:
        try:
            ready = self._client.is_model_ready(
                self.model_name, client_timeout=timeout_s, **self._header_kwargs()
            )
        except InferenceServerException as exc:
            raise DuplexStreamError(f"cannot reach the server: {exc.message()}") from exc
        if not ready:
            raise DuplexStreamError(f"model {self.model_name!r} is not ready on the server")

    # ---- uplink ----------------------------------------------------------------------------

    def start(
        self, params: SessionParams | None = None, ref_audio: np.ndarray | None = None
    ) -> float:
        """Open the stream and send START; `ref_audio`: [n] int16 16 kHz. Returns the send time."""
        self._require(_Phase.NEW, "start")
        if ref_audio is not None:
            _check_pcm(ref_audio, "ref_audio")
        try:
            self._client.start_stream(callback=self._on_response, **self._header_kwargs())
        except InferenceServerException as exc:
            raise DuplexStreamError(f"cannot open the gRPC stream: {exc.message()}") from exc
        self._phase = _Phase.OPEN
        self._demux.open_downlink()
        parameters = (params or SessionParams()).to_parameters()
        self.started_s = self._downlink_since_s = self._send(_EMPTY_PCM, parameters, start=True, ref_audio=ref_audio)
        return self.started_s

    def append(self, pcm16: np.ndarray) -> float:
        """Send `pcm16`: [n] int16 mono 16 kHz. Returns the send time (time.monotonic()).
        Every `downlink_move_s` it first moves the downlink (`move_downlink`)."""
        self._require(_Phase.OPEN, "append")
        _check_pcm(pcm16, "pcm16")
        if self._downlink_move_s is not None and time.monotonic() - self._downlink_since_s >= self._downlink_move_s:
            self.move_downlink()
        return self._send(pcm16, {"action": "append", "sample_rate": INPUT_SAMPLE_RATE})

    def move_downlink(self) -> float | None:
        """Ask the server to carry the downlink on a fresh request; the events go on in order.
        None (nothing sent) while the last move is under way or when the START was refused."""
        self._require(_Phase.OPEN, "move the downlink")
        if self._demux.moving or self._refused:
            return None
        self._downlink_since_s = sent_s = self._send(_EMPTY_PCM, {"action": "move_downlink"}, move=True)
        self.num_downlink_moves += 1
        return sent_s

    def commit(self) -> float:
        self._require(_Phase.OPEN, "commit")
        return self._send(_EMPTY_PCM, {"action": "commit"})

    def cancel(self) -> float:
        """Barge-in: the server cancels the active response."""
        self._require(_Phase.OPEN, "cancel")
        return self._send(_EMPTY_PCM, {"action": "cancel"})

    def end(self) -> float | None:
        """Send END; the server flushes the last audio and closes the downlink. Returns the send
        time, or None when the START was refused: the server ended that sequence itself, and
        Triton would answer an END with "must specify the START flag" (and Triton 2.51 then
        counts it in flight for good, so a server stop waits out its whole exit timeout)."""
        self._require(_Phase.OPEN, "end")
        if self._refused:
            self._phase = _Phase.ENDED
            return None
        sent_s = self._send(_EMPTY_PCM, {}, end=True)
        self._phase = _Phase.ENDED
        return sent_s

    def _send(
        self,
        pcm16: np.ndarray,
        parameters: dict[str, str | int | float],
        *,
        start: bool = False,
        end: bool = False,
        move: bool = False,
        ref_audio: np.ndarray | None = None,
    ) -> float:
        request_id = DOWNLINK_REQUEST_ID if start else f"uplink-{self._num_uplink + 1}"
        inputs = [_int16_input("AUDIO", pcm16)]
        if ref_audio is not None:
            inputs.append(_int16_input("REF_AUDIO", ref_audio))
        sent_s = time.monotonic()
        try:
            self._client.async_stream_infer(
                self.model_name,
                inputs,
                request_id=request_id,
                sequence_id=self.session_id,
                sequence_start=start,
                sequence_end=end,
                enable_empty_final_response=True,
                parameters=parameters or None,
            )
        except InferenceServerException as exc:
            # A broken stream refuses sends; its own error (why it broke, e.g. the server went
            # away) reaches the callback at the same moment, so raise that one where it comes.
            self._raise_stream_error(STREAM_ERROR_WAIT_S)
            raise DuplexStreamError(
                f"session {self.session_id}: send failed: {exc.message()}"
            ) from exc
        if not start:
            self._num_uplink += 1
            (self._demux.expect_move if move else self._demux.expect_uplink)(request_id)
        return sent_s

    def _require(self, phase: _Phase, action: str) -> None:
        if self._phase is not phase:
            raise DuplexStateError(
                f"session {self.session_id}: cannot {action} in phase {self._phase.value!r}"
                f" (needs {phase.value!r})"
            )

    # ---- downlink --------------------------------------------------------------------------

    @property
    def downlink_open(self) -> bool:
        return self._demux.downlink_open

    @property
    def start_refused(self) -> bool:
        """True once the server answered START without `session.created` (an `error` event or
        the downlink's end came first): there is no session, and no END is to be sent."""
        return self._refused

    @property
    def is_settled(self) -> bool:
        """True once the downlink and every uplink request got their FINAL."""
        return self._demux.is_settled

    def next_event(self, timeout_s: float) -> DuplexEvent | None:
        """The next downlink event, or None once the downlink got its FINAL."""
        deadline_s = time.monotonic() + timeout_s
        while self._demux.downlink_open:
            arrival = self._take(deadline_s)
            if arrival is None:
                raise DuplexTimeout(
                    f"session {self.session_id}: no downlink event within {timeout_s} s"
                )
            event = self._process(arrival)
            if event is not None:
                return event
        return None

    def events_until(self, deadline_s: float) -> list[DuplexEvent]:
        """Every event that arrives before `deadline_s` (time.monotonic()); waits until then."""
        events = []
        while (arrival := self._take(deadline_s)) is not None:
            event = self._process(arrival)
            if event is not None:
                events.append(event)
        return events

    def drain(self, timeout_s: float) -> Iterator[DuplexEvent]:
        """Yield the remaining events until the session is settled; raises DuplexTimeout."""
        deadline_s = time.monotonic() + timeout_s
        while not self._demux.is_settled:
            arrival = self._take(deadline_s)
            if arrival is None:
                raise DuplexTimeout(
                    f"session {self.session_id}: not closed within {timeout_s} s (downlink open:"
                    f" {self._demux.downlink_open}, uplink requests without FINAL:"
                    f" {self._demux.num_pending_uplink})"
                )
            event = self._process(arrival)
            if event is not None:
                yield event

    def _on_response(
        self, result: InferResult | None = None, error: InferenceServerException | None = None
    ) -> None:
        # Runs on tritonclient's stream thread: stamp and enqueue, nothing else.
        self._inbox.put(Arrival(time.monotonic(), result, error))

    def _raise_stream_error(self, wait_s: float) -> None:
        """Process what arrives for up to `wait_s`: the demux raises the stream's own error
        (DuplexStreamError) when it comes. Events met on the way are dropped (audio is kept)."""
        deadline_s = time.monotonic() + wait_s
        while self._demux.downlink_open and (arrival := self._take(deadline_s)) is not None:
            self._process(arrival)

    def _take(self, deadline_s: float) -> Arrival | None:
        try:
            return self._inbox.get(timeout=max(deadline_s - time.monotonic(), 0.0))
        except queue.Empty:
            return None

    def _process(self, arrival: Arrival) -> DuplexEvent | None:
        event = self._demux.process(arrival)
        if isinstance(event, AudioDelta):
            self._chunks.append((event.response_id, event.audio))
        self._note_admission(event)
        return event

    def _note_admission(self, event: DuplexEvent | None) -> None:
        # The server frees a refused START's sequence before it sends the `error`, so either
        # one before `session.created` means the sequence is over.
        if self._admitted or self._refused:
            return
        if isinstance(event, SessionCreated):
            self._admitted = True
        elif isinstance(event, ErrorEvent) or not self._demux.downlink_open:
            self._refused = True

    # ---- audio and teardown ----------------------------------------------------------------

    def response_audio(self, response_id: str) -> np.ndarray:
        """[n] int16 24 kHz: every chunk received so far for `response_id`."""
        return _concat([chunk for rid, chunk in self._chunks if rid == response_id])

    def reply_audio(self) -> np.ndarray:
        """[n] int16 24 kHz: every chunk received so far, in arrival order."""
        return _concat([chunk for _, chunk in self._chunks])

    def close(self) -> None:
        """Stop the stream (cancelling it unless settled) and close the client. Idempotent."""
        if self._phase is _Phase.CLOSED:
            return
        try:
            # A graceful stop joins the stream thread, which waits for every FINAL.
            stop_stream(self._client, cancel=not self._demux.is_settled)
        finally:
            self._phase = _Phase.CLOSED
            self._client.close()

    def __enter__(self) -> DuplexSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_pcm(samples: np.ndarray, name: str) -> None:
    if not isinstance(samples, np.ndarray) or samples.dtype != np.int16 or samples.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D int16 numpy array (mono PCM16), got {type(samples).__name__}"
            f" {getattr(samples, 'dtype', '')} {getattr(samples, 'shape', '')}"
        )


def _int16_input(name: str, samples: np.ndarray) -> InferInput:
    infer_input = InferInput(name, [int(samples.shape[0])], "INT16")
    infer_input.set_data_from_numpy(np.ascontiguousarray(samples, dtype="<i2"))
    return infer_input


def _concat(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate(chunks).astype(np.int16, copy=False)
