"""BlockPool: all-or-nothing allocation, conservation, and loud double frees.

Strategy: literal expected ids on a fresh pool, then the failure paths must leave the free list
exactly as it was (a partial allocation or partial free would break exact reservation).
"""

from __future__ import annotations

import pytest

from backends.runner.block_pool import BlockPool, BlockPoolExhausted


def test_allocates_lowest_ids_first_and_conserves_blocks() -> None:
    pool = BlockPool(6)
    first = pool.allocate(2)
    second = pool.allocate(3)
    assert (first, second) == ([0, 1], [2, 3, 4])
    assert pool.num_free_blocks == 1
    pool.free(first)
    assert pool.free_block_ids() == [0, 1, 5]
    assert sorted(pool.allocate(3) + second) == [0, 1, 2, 3, 4, 5]


def test_exhaustion_allocates_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(BlockPoolExhausted, match="need 2 KV blocks, only 1 of 4"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.can_allocate(1) and not pool.can_allocate(2)


@pytest.mark.parametrize("bad", [[1], [2, 2], [3, 9]])
def test_bad_free_raises_and_frees_nothing(bad: list[int]) -> None:
    """[1] is already free, [2, 2] repeats an id, 9 is out of range; none may change the pool."""
    pool = BlockPool(5)
    pool.allocate(4)  # 0..3 in use, 4 free
    pool.free([1])
    with pytest.raises(ValueError, match="double free|outside"):
        pool.free(bad)
    assert pool.free_block_ids() == [1, 4]


def test_rejects_empty_pool_and_negative_counts() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    with pytest.raises(ValueError, match="negative"):
        BlockPool(2).allocate(-1)
