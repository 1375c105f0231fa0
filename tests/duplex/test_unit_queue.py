"""UnitQueue: batches that never mix force_listen flags, the waiting audio it reports, and
`clear` (a close or a barge-in drops every queued unit)."""
from __future__ import annotations

import threading

import numpy as np

from backends.duplex.responses import UnitWork
from backends.duplex.unit_queue import UnitQueue

UNIT = 16000


def _unit(force_listen: bool = False) -> UnitWork:
    return UnitWork(0, np.zeros(UNIT, np.float32), 0.0, force_listen)


def test_waiting_counts_units_until_the_reader_takes_them():
    units = UnitQueue(max_units=2)
    for flag in (True, False, False, False):
        units.put(_unit(flag))
    assert units.waiting_samples == 4 * UNIT
    assert len(units.next_batch()) == 1 and units.waiting_samples == 3 * UNIT  # the flag breaks the batch
    assert len(units.next_batch()) == 2 and units.waiting_samples == UNIT
    assert len(units.next_batch()) == 1 and units.waiting_samples == 0


def test_clear_drops_the_queued_units_and_a_sentinel_then_ends_the_reader():
    units = UnitQueue(max_units=1)
    for _ in range(3):
        units.put(_unit())
    units.clear()
    assert units.waiting_samples == 0
    units.put(None)
    assert units.next_batch() is None


def test_a_reader_waiting_on_an_emptied_queue_wakes_on_the_sentinel():
    units = UnitQueue(max_units=1)
    result: list = []
    reader = threading.Thread(target=lambda: result.append(units.next_batch()))
    reader.start()
    units.clear()
    units.put(None)
    reader.join(5)
    assert result == [None]
