"""A row ledger of captured hidden states: which input token at which position made each row.

The Thinker -> Talker handoff needs, for each handed-over token, the hidden row whose INPUT was
that token. Counting back from the tail breaks as soon as a step forwards extra rows, so rows
are located by content: the latest run of rows whose ids equal the wanted block and whose
positions are strictly consecutive (docs/model_facts.md#thinker-to-talker-handoff).
"""

from __future__ import annotations

from collections import deque

import torch


class HiddenLedger:
    """Per-request ledger; keeps the newest `max_rows` rows (older ones are never handed over)."""

    def __init__(self, hidden_size: int, max_rows: int = 8192) -> None:
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.hidden_size = hidden_size
        self.max_rows = max_rows
        self._token_ids: deque[int] = deque(maxlen=max_rows)
        self._positions: deque[int] = deque(maxlen=max_rows)
        self._rows: deque[torch.Tensor] = deque(maxlen=max_rows)  # each [hidden] float32

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def record(self, token_ids: list[int], positions: list[int], hidden: torch.Tensor) -> None:
        """hidden: [n, hidden_size] rows produced by feeding token_ids[i] at positions[i]."""
        if not len(token_ids) == len(positions) == hidden.shape[0]:
            raise ValueError(
                f"ledger record needs one id and position per hidden row, got "
                f"{len(token_ids)} ids, {len(positions)} positions, {hidden.shape[0]} rows"
            )
        if hidden.dim() != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden rows must be [n, {self.hidden_size}], got {tuple(hidden.shape)}"
            )
        rows = hidden.detach().to(torch.float32)
        self._token_ids.extend(token_ids)
        self._positions.extend(positions)
        self._rows.extend(rows.unbind(0))

    def find_block(self, token_ids: list[int]) -> torch.Tensor | None:
        """[len(token_ids), hidden_size] float32 rows of the latest strictly-consecutive-position
        run whose ids equal `token_ids`; None if there is no such run."""
        if not token_ids:
            return torch.empty(0, self.hidden_size, dtype=torch.float32)
        end = self._find_end(token_ids)
        if end is None:
            return None
        start = end - len(token_ids) + 1
        return torch.stack([self._rows[i] for i in range(start, end + 1)])

    def clear(self) -> None:
        self._token_ids.clear()
        self._positions.clear()
        self._rows.clear()

    def _find_end(self, token_ids: list[int]) -> int | None:
        ids = list(self._token_ids)
        positions = list(self._positions)
        length = len(token_ids)
        for end in range(len(ids) - 1, length - 2, -1):
            start = end - length + 1
            if ids[start : end + 1] == token_ids and _is_consecutive(positions[start : end + 1]):
                return end
        return None


def _is_consecutive(positions: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(positions, positions[1:]))
