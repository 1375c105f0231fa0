"""A step's host draws made together equal the same draws made row by row, bit for bit.

`host_draws.draw_all` stacks the requests of one shape into [rows, n] arrays; `run_together`
drives several rows' sampling steps so that their yielded draws meet in one `draw_all`. Both
must give every row the token `draw_among` / `run_alone` gives it alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.runner.host_draws import (
    DrawRequest,
    DrawSteps,
    draw_all,
    draw_among,
    run_alone,
    run_together,
)

VOCAB = 152_000


def _request(rng: np.random.Generator, size: int, temperature: float, top_p: float,
             scale: float = 4.0, masked: int = 0) -> DrawRequest:
    values = np.sort(scale * rng.standard_normal(size).astype(np.float32))[::-1].copy()
    if masked:
        values[-masked:] = -np.inf
    ids = rng.choice(VOCAB, size=size, replace=False).astype(np.int64)
    seed = int(rng.integers(-(2**63), 2**63 - 1))
    return DrawRequest(values, ids, temperature, top_p, seed)


def _alone(request: DrawRequest) -> int:
    r = request
    return draw_among(r.values, r.ids, r.temperature, r.top_p, r.step_seed)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.8), (1.0, 1.0), (0.3, 0.5), (1.3, 0.97)])
def test_rows_of_one_shape_draw_as_alone(temperature, top_p) -> None:
    rng = np.random.default_rng(int(temperature * 100 + top_p * 10))
    for scale in (0.5, 4.0, 20.0):  # flat to peaked: top-p keeps many or one
        requests = [_request(rng, 20, temperature, top_p, scale) for _ in range(400)]
        assert draw_all(requests) == [_alone(r) for r in requests]


def test_mixed_shapes_masked_tails_and_singles_draw_as_alone() -> None:
    rng = np.random.default_rng(7)
    requests = []
    for size in (1, 2, 7, 8, 9, 16, 20, 21, 33, 64, 128, 129):
        for temperature, top_p in ((0.7, 0.8), (1.0, 1.0)):
            requests += [_request(rng, size, temperature, top_p) for _ in range(3)]
            requests.append(_request(rng, size, temperature, top_p, masked=max(1, size // 3)))
    requests.append(DrawRequest(np.full(5, -np.inf, np.float32), np.arange(5), 0.7, 0.8, 3))
    requests.append(DrawRequest(np.zeros(0, np.float32), np.zeros(0, np.int64), 0.7, 0.8, 3))
    rng.shuffle(requests)  # groups interleave in the step's row order
    assert draw_all(requests) == [_alone(r) for r in requests]


def test_a_row_reduction_sums_as_the_one_dimensional_array() -> None:
    """What `_draw_rows` relies on: numpy's sum along a contiguous row of a 2-D array and
    its cumulative sum give the 1-D results bit for bit, at every length a draw can have."""
    rng = np.random.default_rng(3)
    for size in range(1, 161):
        rows = np.exp(rng.standard_normal((6, size)).astype(np.float32) * 3)
        sums = rows.sum(axis=1, keepdims=True)
        assert all(sums[k, 0] == rows[k].sum() for k in range(6)), size
        cumulative = np.cumsum(rows / sums, axis=1)
        assert all(np.array_equal(cumulative[k], np.cumsum(rows[k] / rows[k].sum()))
                   for k in range(6)), size


def _steps(requests: list[DrawRequest], log: list[str], name: str) -> DrawSteps:
    """A row that asks for its draws in turn and returns their sum plus one."""
    total = 1
    for request in requests:
        log.append(f"{name} asks")
        total += yield request
        log.append(f"{name} got")
    return total


def test_run_together_gives_each_row_its_run_alone_token() -> None:
    rng = np.random.default_rng(11)
    plans = [[], [_request(rng, 20, 0.7, 0.8)], [_request(rng, 20, 0.7, 0.8)],
             [_request(rng, 9, 1.0, 1.0), _request(rng, 20, 0.7, 0.8)], []]
    alone = [run_alone(_steps(plan, [], str(k))) for k, plan in enumerate(plans)]
    log: list[str] = []
    together = run_together([_steps(plan, log, str(k)) for k, plan in enumerate(plans)])
    assert together == alone
    assert together[0] == together[4] == 1  # rows that ask for nothing
    # every row asks before any row gets a draw: that is what lets the draws meet
    assert log[:3] == ["1 asks", "2 asks", "3 asks"]
    assert log[3:] == ["1 got", "2 got", "3 got", "3 asks", "3 got"]
