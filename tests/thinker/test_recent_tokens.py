"""The policy's penalty window keeps its distinct ids as tokens come and go: `hits` always
equals a set built from the window's tokens, before and after its mask exists, with repeats
and evictions."""

from __future__ import annotations

import numpy as np
import pytest

from backends.thinker.recent_tokens import RecentTokens

VOCAB = 64


def _expected_hits(tokens: list[int], ids: np.ndarray) -> list[int]:
    seen = set(tokens)
    return [k for k, token in enumerate(ids.tolist()) if token in seen]


def test_hits_follow_the_window_through_repeats_and_evictions() -> None:
    rng = np.random.default_rng(0)
    recent, window = RecentTokens(8), []
    ids = np.arange(VOCAB, dtype=np.int64)
    for step in range(400):
        token = int(rng.integers(0, 12))  # few ids: many repeats inside the window
        recent.append(token)
        window = (window + [token])[-8:]
        assert recent.tokens() == window and len(recent) == len(window)
        if step % 3 == 0:  # the mask is built on the first ask, then kept up to date
            picked = rng.permutation(ids)[:20]
            assert recent.hits(picked, VOCAB).tolist() == _expected_hits(window, picked)


def test_a_repeat_stays_a_hit_until_its_last_copy_leaves() -> None:
    recent = RecentTokens(3)
    recent.extend([5, 5, 7])
    ids = np.array([5, 7, 9], dtype=np.int64)
    assert recent.hits(ids, VOCAB).tolist() == [0, 1]
    recent.append(9)  # one 5 leaves, one stays
    assert recent.hits(ids, VOCAB).tolist() == [0, 1, 2]
    recent.append(9)  # the last 5 leaves
    assert recent.hits(ids, VOCAB).tolist() == [1, 2]
    recent.append(1)  # 7 leaves
    assert recent.hits(ids, VOCAB).tolist() == [2]


def test_a_wider_vocabulary_rebuilds_the_mask_from_the_window() -> None:
    recent = RecentTokens(4)
    recent.extend([3, 100])
    assert recent.hits(np.array([3, 50], dtype=np.int64), 60).tolist() == [0]  # 100 >= 60
    assert recent.hits(np.array([3, 100], dtype=np.int64), 200).tolist() == [0, 1]


def test_equality_and_bad_window() -> None:
    a, b = RecentTokens(2), RecentTokens(2)
    a.extend([1, 2, 3])
    b.extend([2, 3])
    assert a == b and list(a) == [2, 3]
    b.append(4)
    assert a != b
    with pytest.raises(ValueError, match="window"):
        RecentTokens(0)
