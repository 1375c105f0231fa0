"""The units waiting for the Thinker, and how several of them form one append."""
from __future__ import annotations

import queue
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

    def __post_init__(self) -> None:
        if self.max_units_per_append < 1:
            raise ValueError(f"max_units_per_append must be >= 1, got {self.max_units_per_append}")


class UnitQueue:
    """Filled by the uplink thread, drained by the session's Thinker loop (its only reader).

    A `None` is the end sentinel. A batch takes queued units that share the first one's
    force_listen flag, up to `max_units`; the unit that breaks a batch is held for the next.
    """

    def __init__(self, max_units: int) -> None:
        self._max_units = max_units
        self._queue: queue.SimpleQueue[UnitWork | None] = queue.SimpleQueue()
        self._held: UnitWork | None | object = _NOTHING  # owner: the reader

    def put(self, work: UnitWork | None) -> None:
        self._queue.put(work)

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
        sliding_window_mode=opts.sliding_window_mode,
    )
