"""ESPnet relative positions for the Conformer encoder: the sinusoid table and the score shift.

The table row for relative distance r (query position minus key position) is the usual
sinusoid of r; rows run from distance +(max_positions - 1) down to -(max_positions - 1), as in
the reference's `EspnetRelPositionalEncoding`
(docs/model_facts.md#code2wav-token2wav). It is a function of
the width only, so it is a non-persistent buffer, built once.

For a window of T queries whose first query sits after C cached keys (K = C + T keys in all),
query i and key j are at distance C + i - j. `relative_rows(K, T)` returns the table rows for
distances K - 1 down to -(T - 1) (the only ones a window needs), and `shift_scores` turns the
[T, K + T - 1] products with those rows into [T, K] scores by reading row i from column
T - 1 - i on: exactly the reference's `rel_shift`, which also gives distance C + i - j when
queries are fewer than keys. With caches left-padded to a common C, every row of a batch has
the same distance for the same (query, key slot), so one shift serves the whole batch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_MAX_PERIOD = 10000.0


def sinusoid_table(width: int, max_positions: int) -> torch.Tensor:
    """-> [2 max_positions - 1, width] float32; row k holds distance max_positions - 1 - k."""
    distance = torch.arange(max_positions - 1, -max_positions, -1, dtype=torch.float32)
    # the reference's float32 recipe: sin/cos of distance x exp(-2i log(10000) / width)
    inv_freq = torch.exp(
        torch.arange(0, width, 2, dtype=torch.float32) * -(math.log(_MAX_PERIOD) / width)
    )
    angle = distance[:, None] * inv_freq
    table = torch.zeros(distance.shape[0], width)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table


class RelPositionalEncoding(nn.Module):
    """The shared distance table (`embed.pos_enc` in the reference; no parameters)."""

    def __init__(self, width: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.register_buffer("table", sinusoid_table(width, max_positions), persistent=False)
        # table: [2 max_positions - 1, width] float32

    def relative_rows(self, num_keys: int, num_queries: int) -> torch.Tensor:
        """-> [num_keys + num_queries - 1, width]: distances num_keys - 1 .. -(num_queries - 1)."""
        if num_keys > self.max_positions:
            raise ValueError(
                f"{num_keys} attention keys exceed the relative-position table "
                f"({self.max_positions}); split the input into shorter windows"
            )
        centre = self.max_positions - 1  # row of distance 0
        return self.table[centre - num_keys + 1 : centre + num_queries]


def shift_scores(scores: torch.Tensor, num_keys: int) -> torch.Tensor:
    """scores: [..., T, K + T - 1] products with `relative_rows(K, T)` -> [..., T, K] where
    entry (i, j) is the product with the row of distance (K - T) + i - j."""
    num_queries, width = scores.shape[-2], scores.shape[-1]
    if width != num_keys + num_queries - 1:
        raise ValueError(f"scores width {width} != {num_keys} keys + {num_queries} queries - 1")
    if scores.stride(-1) != 1 or scores.stride(-2) != width:
        scores = scores.contiguous()  # the view below needs whole rows; other dims may stride
    # row i starts at column T - 1 - i: one strided view, no arithmetic
    strides = (*scores.stride()[:-2], width - 1, 1)
    size = (*scores.shape[:-1], num_keys)
    return scores.as_strided(size, strides, scores.storage_offset() + num_queries - 1)
