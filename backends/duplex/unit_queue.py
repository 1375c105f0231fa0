"""The units waiting for the Thinker, and how several of them form one append."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np

from backends.contracts.messages import ThinkerRequest
from backends.contracts.stage_clients import THINKER
from backends.duplex.responses import EpochIds, UnitWork
from backends.duplex.uplink import SessionOptions

_NOTHING = object()  # no unit held back by `next_batch`
_WAKE = object()  # `wake`: the reader returns at once with an empty batch


@dataclass(frozen=True, slots=True)
class SessionConfig:
    # Units per Thinker append when the uplink is ahead of the Thinker. A multi-unit append
    # is decided once (on its last unit), so >1 trades decisions for catching up under load.
    max_units_per_append: int = 1
    # How far (s) the uplink may run ahead of real time and of the model (uplink_pace.py).
    max_uplink_ahead_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_units_per_append < 1:
            raise ValueError(f"max_units_per_append must be >= 1, got {self.max_units_per_append}")
        if not self.max_uplink_ahead_s > 0:
            raise ValueError(f"max_uplink_ahead_s must be positive, got {self.max_uplink_ahead_s}")


class UnitQueue:
    """Filled by the uplink thread, drained by the session's Thinker loop (its only reader).

    A `None` is the end sentinel. A batch takes queued units that share the first one's
    force_listen flag, up to `max_units`; the unit that breaks a batch is held for the next.
    `waiting_samples` counts the audio of the units not yet handed to the reader (the uplink
    bound weighs it).
    """

    def __init__(self, max_units: int) -> None:
        self._max_units = max_units
        self._queue: queue.SimpleQueue[UnitWork | None] = queue.SimpleQueue()
        self._held: UnitWork | None | object = _NOTHING  # owner: the reader
        self._count_lock = threading.Lock()  # guards _waiting
        self._waiting = 0

    @property
    def waiting_samples(self) -> int:
        return self._waiting

    def put(self, work: UnitWork | None) -> None:
        if work is not None:
            self._count(work.samples.size)
        self._queue.put(work)

    def clear(self) -> None:
        """Drop every queued unit (a close or a barge-in); the caller then puts the sentinel or
        a `wake`, which also ends a reader's wait that the emptied queue would prolong."""
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(work, UnitWork):
                self._count(-work.samples.size)

    def _count(self, samples: int) -> None:
        with self._count_lock:
            self._waiting += samples

    def wake(self) -> None:
        """Make the reader's wait return (an empty batch): a new epoch wants its setup sent."""
        self._queue.put(_WAKE)  # type: ignore[arg-type]

    def next_batch(self) -> list[UnitWork] | None:
        """The next append's units (oldest first), [] after a `wake`, or None at the end."""
        first = self._next()
        if first is None or first is _WAKE:
            return None if first is None else []
        batch = [first]
        while len(batch) < self._max_units and not self._queue.empty():
            nxt = self._queue.get()
            if nxt is _WAKE:  # the loop sends the new epoch's setup before its next batch
                break
            if nxt is None or nxt.force_listen != first.force_listen:
                self._held = nxt  # the sentinel or the first unit of the next append
                break
            batch.append(nxt)
        self._count(-sum(work.samples.size for work in batch))
        return batch

    def _next(self) -> UnitWork | None:
        if self._held is not _NOTHING:
            held, self._held = self._held, _NOTHING
            return held  # type: ignore[return-value]
        return self._queue.get()


def setup_request(ids: EpochIds, opts: SessionOptions) -> ThinkerRequest:
    """Seq 0 of the epoch without audio: the session setup alone, which the Thinker prefills
    before the first unit is complete."""
    return thinker_request(ids, [], opts)


def thinker_request(ids: EpochIds, batch: list[UnitWork], opts: SessionOptions) -> ThinkerRequest:
    """The append of `batch` to the epoch's Thinker request; seq 0 carries the session setup.
    Marks the Thinker as holding a live request of the epoch (it is about to be sent)."""
    seq = ids.next_seq
    ids.next_seq += 1
    ids.started.add(THINKER)
    setup = seq == 0
    audio = np.concatenate([w.samples for w in batch]) if batch else np.zeros(0, np.float32)
    return ThinkerRequest(
        request_id=ids.request_id, audio=audio, seq=seq,
        force_listen=bool(batch) and batch[0].force_listen,
        instructions=opts.instructions if setup else "",
        initial_user_text=opts.initial_user_text if setup and ids.epoch == 0 else "",
        ref_audio=opts.ref_audio if setup and opts.ref_audio is not None else np.zeros((0,), np.float32),
        temperature=opts.temperature, seed=opts.seed + ids.epoch,
        reply_units=opts.reply_units, reply_tokens_per_unit=opts.reply_tokens_per_unit,
        sliding_window_mode=opts.sliding_window_mode, max_kv_tokens=opts.max_kv_tokens, top_k=opts.top_k,
        top_p=opts.top_p,
        max_new_speak_tokens_per_chunk=opts.max_new_speak_tokens_per_chunk,
        listen_prob_scale=opts.listen_prob_scale, length_penalty=opts.length_penalty,
        text_repetition_penalty=opts.text_repetition_penalty,
        text_repetition_window_size=opts.text_repetition_window_size,
        listen_when_silent=opts.listen_when_silent, max_reply_tokens=opts.max_reply_tokens,
    )
