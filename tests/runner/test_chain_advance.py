"""The fused chain-advance kernel equals the torch ops it replaced (Triton's interpreter on CPU).

Strategy: random staged decode buffers (some rows live, some padding on the scratch slot, page
boundaries crossed, positions at a page's last token) advanced by the kernel and by the torch
reference written out here; every buffer must be bit-identical, the rows past `rows` untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from backends.runner.chain_advance import advance_rows  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CAP, MAX_BLOCKS, BLOCK_SIZE, SCRATCH = 8, 6, 4, 31


def reference(i64: torch.Tensor, i32: torch.Tensor, tokens: torch.Tensor, rows: int) -> None:
    """The torch version of `DecodeGraphs.advance` before the kernel (in place)."""
    live = i64[3, :rows] != SCRATCH
    step = live.to(torch.int64)
    i64[0, :rows] = torch.where(live, tokens[:rows], 0)
    i64[1, :rows] += step
    i32[: 2 * CAP].view(2, CAP)[:, :rows] += step.to(torch.int32)
    positions = i64[1, :rows]
    tables = i32[2 * CAP :].view(CAP, MAX_BLOCKS)[:rows]
    pages = tables.gather(1, (positions // BLOCK_SIZE)[:, None])[:, 0].to(torch.int64)
    slots = pages * BLOCK_SIZE + positions % BLOCK_SIZE
    i64[2, :rows] = torch.where(live, slots, i64[2, :rows])


def staged(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    i64 = torch.zeros(4, CAP, dtype=torch.int64)
    i64[0] = torch.from_numpy(rng.integers(0, 6000, CAP))
    i64[1] = torch.from_numpy(rng.integers(0, MAX_BLOCKS * BLOCK_SIZE - 1, CAP))
    i64[1, 0] = BLOCK_SIZE - 1  # the next position opens a new page
    i64[2] = torch.from_numpy(rng.integers(0, 500, CAP))
    i64[3] = torch.from_numpy(rng.choice([SCRATCH, 1, 2, 5], CAP))
    i64[3, 1] = SCRATCH
    lens = torch.from_numpy(rng.integers(1, 20, 2 * CAP)).to(torch.int32)
    tables = torch.from_numpy(rng.permutation(200)[: CAP * MAX_BLOCKS]).to(torch.int32)
    tokens = torch.from_numpy(rng.integers(0, 6000, CAP))
    return i64, torch.cat([lens, tables]), tokens


@pytest.mark.parametrize("rows", [1, 3, CAP])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.interpreter
def test_advance_kernel_equals_the_torch_ops(rows: int, seed: int) -> None:
    i64, i32, tokens = staged(seed)
    want64, want32 = i64.clone(), i32.clone()
    reference(want64, want32, tokens, rows)
    advance_rows(i64, i32, tokens, rows, SCRATCH, BLOCK_SIZE, MAX_BLOCKS)
    assert torch.equal(i64, want64) and torch.equal(i32, want32)
    if rows < CAP:  # and the rows past `rows` were not touched at all
        fresh64, fresh32, _ = staged(seed)
        assert torch.equal(i64[:, rows:], fresh64[:, rows:])
