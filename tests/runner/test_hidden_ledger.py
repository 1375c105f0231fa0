"""HiddenLedger: content-addressed lookup of captured hidden rows for the Talker handoff.

Strategy: rows whose hidden values encode their own record index, so a lookup that returns the
wrong occurrence (oldest instead of latest, a run with a position gap, counted from the tail)
is visible in the returned values.
"""

from __future__ import annotations

import pytest
import torch

from backends.runner.hidden_ledger import HiddenLedger

HIDDEN = 3


def rows(*values: float) -> torch.Tensor:
    """[len(values), HIDDEN] rows whose entries all equal the given value."""
    return torch.tensor(values).unsqueeze(1).repeat(1, HIDDEN)


def test_latest_consecutive_occurrence_wins() -> None:
    ledger = HiddenLedger(HIDDEN)
    ledger.record([5, 6, 7], [0, 1, 2], rows(0, 1, 2))
    ledger.record([5, 6], [3, 4], rows(3, 4))
    ledger.record([9], [5], rows(5))
    assert ledger.find_block([5, 6]).tolist() == rows(3, 4).tolist()
    assert ledger.find_block([5, 6, 7]).tolist() == rows(0, 1, 2).tolist()


def test_position_gap_breaks_a_run() -> None:
    """Two ids recorded in different steps with a gap in positions are not one block."""
    ledger = HiddenLedger(HIDDEN)
    ledger.record([1, 2], [0, 1], rows(0, 1))
    ledger.record([1], [10], rows(2))
    ledger.record([2], [12], rows(3))  # right ids, but position 12 does not follow 10
    assert ledger.find_block([1, 2]).tolist() == rows(0, 1).tolist()
    assert ledger.find_block([2, 1]) is None


def test_oldest_rows_are_evicted_and_empty_block_is_empty() -> None:
    ledger = HiddenLedger(HIDDEN, max_rows=3)
    ledger.record([1, 2, 3, 4], [0, 1, 2, 3], rows(0, 1, 2, 3))
    assert ledger.num_rows == 3 and ledger.find_block([1]) is None
    assert ledger.find_block([2, 3, 4]).tolist() == rows(1, 2, 3).tolist()
    assert ledger.find_block([]).shape == (0, HIDDEN)
    ledger.clear()
    assert ledger.num_rows == 0 and ledger.find_block([4]) is None


def test_record_rejects_mismatched_lengths() -> None:
    ledger = HiddenLedger(HIDDEN)
    with pytest.raises(ValueError, match="2 ids, 2 positions, 3 rows"):
        ledger.record([1, 2], [0, 1], rows(0, 1, 2))
    with pytest.raises(ValueError, match=r"\[n, 3\]"):
        ledger.record([1], [0], torch.zeros(1, 4))
