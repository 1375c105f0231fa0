"""Exact draws on one host logits row at linear cost: the runner's host sampler and a stage's
sampling policy (the Thinker's duplex policy) draw here.

Per token on a 151,936-entry row (one CPU core), a full-vocabulary sort for top-p took ~12 ms
and float64 Gumbel noise over the row ~1 ms. Here each full-row pass is linear (top-k,
logsumexp) and the rest works on the top-k survivors only, in numpy: a torch op costs ~10 us to
dispatch whatever its size, and the draw after top-k was some 60 of them (~1.1 of its 1.4 ms
on the H200 host, paid per row: 16 rows of a batch-16 Thinker step in turn):

- `boundary_hit`: "a categorical draw from softmax(row) is `token`" is a Bernoulli draw with
  p = softmax(row)[token]: one uniform, the same distribution as a whole-row draw (the duplex
  policy's rule 4);
- `filtered_draw`: temperature, top-k (ties at the k-th value kept), top-p, then the
  Gumbel-max draw over the survivors with the counter-based noise keyed on (step seed, token
  id) (`uniforms_at`, bit for bit `device_sampler.uniform_at`): the very token a whole-row
  argmax of (filtered logits + noise) picks, as the device sampler does, since filtered-out
  tokens sit at -inf (up to the last-ulp differences any two devices' exp and log have).

The top-k pass over the whole row (~0.4-0.7 ms of a draw on one core) is skipped when the
runner hands the raw row's top candidates, taken for all of a step's hooked rows in one device
top-k (`TopCandidates`): masks and repetition penalties only ever lower a logit, so a token
outside them cannot rise above their smallest raw value, and when enough of them stay above it
the filtered row's top-k (ties included) lies among them. Otherwise the draw takes the row.

A step's rows are sampled in turn, but the draw after the top-k (~37 us a row in numpy's
dispatch) can be left to the caller (`DrawRequest`), who makes a step's draws together
(`run_together`, `draw_all`: [rows, n] arrays, the row-by-row tokens bit for bit).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import torch

from backends.runner.device_sampler import GOLDEN, MIX1, MIX2, UNIFORM_BITS

_BOUNDARY_KEY = -1  # the uniform of `boundary_hit`; token noise uses ids >= 0
TOP_CANDIDATES = 128  # candidates per hooked row: top-k 20 plus room for masked / penalised ids
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TopCandidates:
    """The largest logits of a row's first `limit` ids before any mask or penalty, descending,
    with their ids. Ids from `limit` on (a vocabulary's padding, which a policy masks) are not
    among them: a draw checks them on the row, one max over them."""

    values: np.ndarray  # [n] float32
    ids: np.ndarray  # [n] int64
    limit: int


# uint64 constants made once (with np.errstate, building them per call was ~40% of the noise)
_GOLDEN, _MIX1, _MIX2 = (np.uint64(c & _U64) for c in (GOLDEN, MIX1, MIX2))
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(64 - UNIFORM_BITS))
_HALF, _SCALE = np.float32(0.5), np.float32(2.0**-UNIFORM_BITS)


def uniforms_at(step_seed: int | np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """[n] int64 token ids -> [n] float32 uniforms, bitwise `device_sampler.uniform_at`
    (splitmix64's finaliser on uint64, wrapping: array arithmetic, in place). `step_seed`
    may be a uint64 array that broadcasts against the ids (a seed per row of [rows, n])."""
    x = (token_ids + 1).astype(np.uint64)
    x *= _GOLDEN
    x += step_seed if isinstance(step_seed, np.ndarray) else np.uint64(step_seed & _U64)
    for shift, factor in ((_SHIFTS[0], _MIX1), (_SHIFTS[1], _MIX2)):
        x ^= x >> shift
        x *= factor
    x ^= x >> _SHIFTS[2]
    x >>= _SHIFTS[3]
    uniforms = x.astype(np.float32)  # < 2^23 + 0.5: exact in float32, as on the device
    uniforms += _HALF
    uniforms *= _SCALE
    return uniforms


def one_uniform_at(step_seed: int, token_id: int) -> float:
    """`uniforms_at` of one id in Python integers (a float32 value): a 1-element array paid
    ~25 us of numpy dispatch for the boundary draw's single uniform."""
    x = (step_seed + (token_id + 1) * (GOLDEN & _U64)) & _U64
    x = ((x ^ (x >> 30)) * (MIX1 & _U64)) & _U64
    x = ((x ^ (x >> 27)) * (MIX2 & _U64)) & _U64
    bits = (x ^ (x >> 31)) >> (64 - UNIFORM_BITS)
    return (bits + 0.5) * 2.0**-UNIFORM_BITS  # exact: 24 significant bits


def boundary_hit(row: torch.Tensor, token: int, greedy: bool, step_seed: int) -> bool:
    """row: [vocab] float32 raw logits -> whether the step's raw-softmax draw is `token`."""
    if greedy:
        return int(torch.argmax(row)) == token
    return bernoulli_hit(float(row[token] - torch.logsumexp(row, dim=0)), step_seed)


def bernoulli_hit(log_p: float, step_seed: int) -> bool:
    """`boundary_hit`'s draw from the token's raw log-probability (float32)."""
    return bool(one_uniform_at(step_seed, _BOUNDARY_KEY) < np.exp(np.float32(log_p)))


def filtered_draw(
    row: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    step_seed: int,
    hint: TopCandidates | None = None,
) -> int:
    """row: [vocab] float32 logits, masked and penalised -> one token (argmax when greedy).
    hint: the row's raw top candidates, taken before every change made to it since, all of
    which must have lowered logits (masks, a repetition penalty >= 1): the caller vouches."""
    if temperature == 0.0:
        return int(torch.argmax(row))
    hinted = _hinted_top_k(row, top_k, hint) if hint is not None else None
    values, ids = hinted if hinted is not None else _candidates(row, top_k, sort=top_p < 1.0)
    return draw_among(values, ids, temperature, top_p, step_seed)


def draw_among(
    values: np.ndarray, ids: np.ndarray, temperature: float, top_p: float, step_seed: int
) -> int:
    """The draw after top-k: values (float32, descending, -inf allowed) of the surviving ids
    -> temperature, top-p, then the keyed Gumbel-max over what is left."""
    keep = values > -np.inf
    scaled, ids = values[keep] / np.float32(temperature), ids[keep]
    if top_p < 1.0 and scaled.size:
        keep = _top_p_kept(scaled, top_p)
        scaled, ids = scaled[keep], ids[keep]
    if ids.size == 0:  # every logit is -inf: as a whole-row argmax would, take the first
        return 0
    return int(ids[np.argmax(scaled + _gumbel(step_seed, ids))])


def _top_p_kept(scaled: np.ndarray, top_p: float) -> np.ndarray:
    """The top-p cut along the last axis of finite scaled values sorted descending (one row,
    or [rows, n]: a reduction along a contiguous row sums as the row alone does)."""
    exp = np.exp(scaled - scaled[..., :1])  # [0] is the max
    probs = exp / exp.sum(axis=-1, keepdims=True)
    return np.cumsum(probs, axis=-1) - probs < top_p  # never drops the most likely


def _gumbel(step_seed: int | np.ndarray, ids: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(uniforms_at(step_seed, ids)))


@dataclass(frozen=True, slots=True)
class DrawRequest:
    """A `draw_among` left for the caller to make, so that it can draw a step's rows at once
    (`draw_all`): a sampler that yields one takes the drawn token back by `send`."""

    values: np.ndarray  # float32, descending
    ids: np.ndarray  # int64
    temperature: float
    top_p: float
    step_seed: int

    def draw_alone(self) -> int:
        return draw_among(self.values, self.ids, self.temperature, self.top_p, self.step_seed)


# A row's sampling as a generator: yields the draws it wants made, returns its token.
DrawSteps = Generator[DrawRequest, int, int]


def run_alone(steps: DrawSteps) -> int:
    """One row's sampling, each of its draws made as it asks."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.draw_alone())
    except StopIteration as done:
        return done.value


def run_together(rows: list[DrawSteps]) -> list[int]:
    """Several rows' sampling (each a different request), their draws made together: a row's
    tokens are those of `run_alone`. Rows advance in rounds, so a row's steps after its draw
    run after every row has asked."""
    tokens: list[int] = [0] * len(rows)
    waiting: list[tuple[int, DrawSteps, DrawRequest]] = []
    for k, steps in enumerate(rows):
        try:
            waiting.append((k, steps, next(steps)))
        except StopIteration as done:
            tokens[k] = done.value
    while waiting:
        drawn = draw_all([request for _, _, request in waiting])
        asked, waiting = waiting, []
        for (k, steps, _), token in zip(asked, drawn):
            try:
                waiting.append((k, steps, steps.send(token)))
            except StopIteration as done:
                tokens[k] = done.value
    return tokens


def draw_all(requests: list[DrawRequest]) -> list[int]:
    """`draw_among` of each request, bit for bit; those of one shape (as many values, all
    finite, one temperature and top-p) as [rows, n] arrays: numpy's dispatch, ~2 us an op,
    is paid once per group instead of once per row (~37 -> ~3 us a row)."""
    tokens: list[int] = [0] * len(requests)
    groups: dict[tuple[int, float, float], list[int]] = {}
    for k, r in enumerate(requests):
        if r.values.size and np.isfinite(r.values[-1]):  # descending: all finite
            groups.setdefault((r.values.size, r.temperature, r.top_p), []).append(k)
        else:
            tokens[k] = r.draw_alone()
    for (_, temperature, top_p), rows in groups.items():
        picked = [requests[k] for k in rows]
        alone = len(picked) == 1
        drawn = [picked[0].draw_alone()] if alone else _draw_rows(picked, temperature, top_p)
        for k, token in zip(rows, drawn):
            tokens[k] = token
    return tokens


def _draw_rows(requests: list[DrawRequest], temperature: float, top_p: float) -> list[int]:
    """`draw_among` over [rows, n] finite values: row by row the same float32 operations,
    with the ids past the top-p cut left out by -inf rather than by compaction (argmax keeps
    the order and takes the first of ties, as on the compacted row)."""
    values = np.stack([r.values for r in requests])
    ids = np.stack([r.ids for r in requests])
    scaled = values / np.float32(temperature)
    seeds = np.array([r.step_seed & _U64 for r in requests], dtype=np.uint64)
    score = scaled + _gumbel(seeds[:, None], ids)
    if top_p < 1.0:
        score[~_top_p_kept(scaled, top_p)] = -np.inf
    return ids[np.arange(len(requests)), np.argmax(score, axis=1)].tolist()


def top_k_among(
    current: np.ndarray, ids: np.ndarray, top_k: int, bound: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """The row's top-k (ties with the k-th kept; descending, equal values by id) from some of
    its ids alone: `current` holds their values, and every other id's value is at most
    `bound`. None where that cannot decide it: the (k+1)-th value here must exceed `bound`."""
    if top_k < 1 or ids.size <= top_k:
        return None
    order = np.lexsort((ids, -current))  # value descending, ties by id as `_candidates`
    ranked = current[order]
    if not ranked[top_k] > bound:
        return None
    tie = ranked[top_k] == ranked[top_k - 1]  # ties with the k-th stay candidates
    kept = order[ranked >= ranked[top_k - 1]] if tie else order[:top_k]
    return current[kept], ids[kept]


def argmax_among(current: np.ndarray, ids: np.ndarray, bound: float) -> int | None:
    """A whole-row argmax (the first id of the largest value) from some ids' values alone,
    every other id's value being at most `bound`; None where the largest does not exceed it."""
    if ids.size == 0:
        return None
    best = current.max()
    if not best > bound:
        return None
    return int(ids[current == best].min())


def _candidates(row: torch.Tensor, top_k: int, sort: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest logits and their ids (float32, int64), descending (equal values by id),
    plus any tied with the k-th; without top-k the whole row (sorted only if top-p needs the
    order)."""
    vocab = row.shape[0]
    if top_k < 1 or top_k >= vocab:
        if sort:
            values, ids = torch.sort(row, descending=True)
            return values.cpu().numpy(), ids.cpu().numpy()
        return row.cpu().numpy(), np.arange(vocab, dtype=np.int64)
    values, ids = (tensor.cpu().numpy() for tensor in torch.topk(row, top_k + 1))
    kth = values[-2]
    if values[-1] < kth or kth == -np.inf:  # no finite tie with the k-th beyond it
        order = np.lexsort((ids[:-1], -values[:-1]))  # equal values by id: one order always
        return values[:-1][order], ids[:-1][order]
    tied = torch.nonzero(row >= float(kth)).flatten()
    order = torch.argsort(row[tied], descending=True, stable=True)
    return row[tied][order].cpu().numpy(), tied[order].cpu().numpy()


def _hinted_top_k(
    row: torch.Tensor, top_k: int, hint: TopCandidates
) -> tuple[np.ndarray, np.ndarray] | None:
    """`_candidates(row, top_k)` from the hint alone, or None where it cannot be sure: the
    (k+1)-th current value among the hint must exceed the hint's smallest raw value, which
    bounds every other id below the hint's limit, and every id past the limit."""
    if row.device.type != "cpu":
        return None
    values = row.numpy()
    tail = values[hint.limit :]  # ids past the limit could compete
    bound = max(hint.values[-1], tail.max()) if tail.size else hint.values[-1]
    return top_k_among(values[hint.ids], hint.ids, top_k, bound)
