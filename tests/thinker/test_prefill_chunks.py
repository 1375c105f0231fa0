"""How an append's rows are split over steps (backends/thinker/prefill_chunks.py); the engine
tests (tests/stages/test_thinker_engine.py, test_thinker_window.py) show chunked prefills
leave the KV and every sampled token as one prefill does."""
from __future__ import annotations

import pytest

from backends.thinker.prefill_chunks import chunk_rows


def _split(rows: int, limit: int) -> list[int]:
    chunks = []
    while rows:
        chunks.append(chunk_rows(rows, limit))
        rows -= chunks[-1]
    return chunks


@pytest.mark.parametrize(("rows", "limit", "want"), [
    (65, 32, [22, 22, 21]),
    (64, 32, [32, 32]),
    (33, 32, [17, 16]),
    (32, 32, [32]),
    (13, 32, [13]),
    (100, 0, [100]),  # no limit
    (7, 1, [1] * 7),
])
def test_rows_split_evenly_under_the_limit(rows: int, limit: int, want: list[int]) -> None:
    assert _split(rows, limit) == want
