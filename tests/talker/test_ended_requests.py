"""Tests for backends/talker/ended_requests.py: late conditions of ended Talker requests.

Strategy: exact checks on a tiny capacity, so eviction order is visible.
"""

from __future__ import annotations

import pytest

from backends.contracts.errors import StageError
from backends.talker.ended_requests import EndedRequests

CANCELLED = StageError("cancelled", "stopped")


def test_late_condition_is_refused_with_the_ending_code() -> None:
    ended = EndedRequests(capacity=4)
    ended.add("a", CANCELLED)
    refusal = ended.refusal("a", condition_seq=3)
    assert refusal is not None and refusal.code == "cancelled"
    assert "already ended" in refusal.message
    assert "a" in ended  # refusing does not forget


def test_seq_zero_restarts_a_reused_request_id() -> None:
    """A client reusing a session id gets the same request id back, starting at seq 0."""
    ended = EndedRequests(capacity=4)
    ended.add("a", CANCELLED)
    assert ended.refusal("a", condition_seq=0) is None
    assert "a" not in ended


def test_unknown_id_is_accepted() -> None:
    assert EndedRequests().refusal("never-seen", condition_seq=5) is None


def test_oldest_ids_are_forgotten_first() -> None:
    ended = EndedRequests(capacity=2)
    for request_id in ("a", "b", "c"):
        ended.add(request_id, CANCELLED)
    assert "a" not in ended and "b" in ended and "c" in ended


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        EndedRequests(capacity=0)
