"""Free list of KV-cache blocks (pages). Host-only bookkeeping; the tensors live in `KVCache`."""

from __future__ import annotations


class BlockPoolExhausted(RuntimeError):
    """Fewer free blocks than requested; nothing was allocated."""


class BlockPool:
    """Hands out block ids in [0, num_blocks) and takes them back exactly once.

    All-or-nothing allocation is what makes exact reservation possible: a request either gets
    every block it asked for at admission or none, so a step can never run out of pages.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        # Popped from the end: lowest ids first, which keeps fresh pools easy to read in tests.
        self._free_ids: list[int] = list(range(num_blocks - 1, -1, -1))
        self._is_free: list[bool] = [True] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids)

    def can_allocate(self, num_blocks: int) -> bool:
        return 0 <= num_blocks <= len(self._free_ids)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num_blocks})")
        if not self.can_allocate(num_blocks):
            raise BlockPoolExhausted(
                f"need {num_blocks} KV blocks, only {self.num_free_blocks} of "
                f"{self.num_blocks} are free"
            )
        block_ids = [self._free_ids.pop() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._is_free[block_id] = False
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Return blocks to the pool; raises ValueError (freeing none) on a double or bad free."""
        seen: set[int] = set()
        for block_id in block_ids:
            if not 0 <= block_id < self.num_blocks:
                raise ValueError(f"block id {block_id} is outside [0, {self.num_blocks})")
            if self._is_free[block_id] or block_id in seen:
                raise ValueError(f"double free of KV block {block_id}")
            seen.add(block_id)
        for block_id in reversed(block_ids):
            self._is_free[block_id] = True
            self._free_ids.append(block_id)

    def free_block_ids(self) -> list[int]:
        """Sorted snapshot of the free ids (for invariant checks)."""
        return sorted(self._free_ids)
