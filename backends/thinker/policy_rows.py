"""The duplex policy's operations on one logits row, whole or as a runner summary.

The policy reads the raw row once (the boundary draw, rule 4), then changes logits (masks, the
repetition penalty, the turn_eos length penalty, the listen scale) and draws (rule 5).
`WholeRow` does that on the [vocab] host row, as the runner's hooks always did. `SummaryRow`
does it on a `host_rows.CompactRow`: the raw row's top candidates, logsumexp and probe values.
Every id outside the candidates starts at most the smallest raw candidate (or, past their limit,
the raw tail's largest value, or -inf once a mask covers the tail); each change moves that bound
as it could move any such id (the official repetition penalty divides a logit whatever its sign,
so it raises negative ones: the bound b becomes max(b, b / penalty)). Where the (k+1)-th
changed candidate still beats the bound, the candidates alone hold the changed row's top-k and
the draw is the whole row's draw, bit for bit (`host_draws.top_k_among`). Where it does not,
the summary fetches the whole raw row and replays the changes on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from backends.runner.host_draws import (
    DrawRequest,
    TopCandidates,
    argmax_among,
    bernoulli_hit,
    boundary_hit,
    filtered_draw,
    top_k_among,
)
from backends.runner.host_rows import CompactRow
from backends.thinker.policy_masks import PolicyIds
from backends.thinker.recent_tokens import RecentTokens


class PolicyRow(Protocol):
    def boundary_hit(self, token: int, greedy: bool, step_seed: int) -> bool:
        """Rule 4 on the raw row: whether its raw-softmax draw is `token`."""
        ...

    def mask(self, id_set: str) -> None:
        """-inf on the ids of `id_set` (a `PolicyIds` set)."""
        ...

    def penalise(self, recent: RecentTokens, penalty: float) -> None:
        """The repetition penalty over the distinct ids of the penalty window: each logit
        divided by `penalty` whatever its sign (the official duplex decoder's arithmetic)."""
        ...

    def change(self, token: int, kind: str, factor: float) -> None:
        """One id's logit: `kind` "length" divides a positive logit by `factor` and multiplies
        a negative one (the turn_eos length penalty), "scale" multiplies it (listen scale)."""
        ...

    def draw(self, temperature: float, top_k: int, top_p: float, step_seed: int) -> int | DrawRequest:
        """`host_draws.filtered_draw` of the row as changed so far. Its last part, `draw_among`
        of the top-k, may come back as a `DrawRequest` for the caller to make."""
        ...


def official_penalty(values: np.ndarray, penalty: float) -> np.ndarray:
    """float32 values / penalty, as `logits[0, id] /= penalty` on a float32 row."""
    return (values / np.float32(penalty)).astype(np.float32)


def changed_value(value: np.float32, kind: str, factor: float) -> np.float32:
    """`PolicyRow.change` of one float32 logit."""
    f = np.float32(factor)
    if kind == "length":
        return np.float32(value / f) if value > 0 else np.float32(value * f)
    if kind == "scale":
        return np.float32(value * f)
    raise ValueError(f"unknown change {kind!r}")


class WholeRow:
    def __init__(
        self, logits: torch.Tensor, ids: PolicyIds, candidates: TopCandidates | None
    ) -> None:
        self.logits = logits  # [vocab] float32, changed in place
        self.ids = ids
        self.candidates = candidates
        self.raised = False  # a change raised some logit: the raw candidates may not serve

    def boundary_hit(self, token: int, greedy: bool, step_seed: int) -> bool:
        return boundary_hit(self.logits, token, greedy, step_seed)

    def mask(self, id_set: str) -> None:
        self.ids.fill(self.logits, id_set)

    def penalise(self, recent: RecentTokens, penalty: float) -> None:
        if penalty == 1.0 or not len(recent):
            return
        if self.logits.device.type != "cpu":  # the same float32 division, on the device
            ids = torch.tensor(sorted(set(recent.tokens())), dtype=torch.int64, device=self.logits.device)
            ids = ids[ids < self.logits.shape[0]]
            kept = self.logits[ids]
            raises = bool((kept < 0).any()) if penalty > 1.0 else bool((kept > 0).any())
            self.raised = self.raised or raises
            self.logits[ids] = kept / penalty
            return
        row = self.logits.numpy()  # a host row: numpy, a few dispatches
        ids = np.fromiter(set(recent.tokens()), dtype=np.int64)
        ids = ids[ids < row.shape[0]]
        kept = row[ids]
        new = official_penalty(kept, penalty)
        self.raised = self.raised or bool(np.any(new > kept))
        row[ids] = new

    def change(self, token: int, kind: str, factor: float) -> None:
        old = np.float32(self.logits[token].item())
        new = changed_value(old, kind, factor)
        self.logits[token] = float(new)
        self.raised = self.raised or bool(new > old)

    def draw(self, temperature: float, top_k: int, top_p: float, step_seed: int) -> int:
        hint = None if self.raised else self.candidates
        return filtered_draw(self.logits, temperature, top_k, top_p, step_seed, hint)


class SummaryRow:
    def __init__(self, row: CompactRow, ids: PolicyIds) -> None:
        self.row = row
        self.ids = ids
        self.current = row.candidates.values.copy()  # the candidates' values as changed
        self.tail_bound = row.tail_max  # bounds every id past the candidates' limit
        self._changes: list[Callable[[torch.Tensor], None]] = []  # replayed on a fetched row
        # how the changes so far could move an id outside the candidates, applied to the bound
        self._bound_moves: list[Callable[[float], float]] = []

    def boundary_hit(self, token: int, greedy: bool, step_seed: int) -> bool:
        if greedy:
            return self.row.is_argmax(token)
        return bernoulli_hit(float(self.row.value(token) - self.row.logsumexp), step_seed)

    def mask(self, id_set: str) -> None:
        top, vocab = self.row.candidates, self.row.vocab
        self.current[self.ids.host_mask(id_set, vocab)[top.ids]] = -np.inf
        if self.ids.covers(id_set, top.limit, vocab):
            self.tail_bound = np.float32(-np.inf)
        self._changes.append(lambda row: self.ids.fill(row, id_set))

    def penalise(self, recent: RecentTokens, penalty: float) -> None:
        if penalty == 1.0 or not len(recent):
            return
        hit = recent.hits(self.row.candidates.ids, self.row.vocab)
        self.current[hit] = official_penalty(self.current[hit], penalty)
        tokens = recent.tokens()  # replayed within this draw, before the drawn token joins
        self._changes.append(lambda row: WholeRow(row, self.ids, None).penalise(
            _Fixed(tokens), penalty))
        self._bound_moves.append(lambda b: max(b, float(official_penalty(np.float32(b), penalty))))

    def change(self, token: int, kind: str, factor: float) -> None:
        top = self.row.candidates
        hit = np.flatnonzero(top.ids == token)
        if hit.size:
            self.current[hit[0]] = changed_value(self.current[hit[0]], kind, factor)
        elif kind == "scale" or factor < 1.0:  # may raise an id outside the candidates
            value = float(changed_value(self.row.value(token), kind, factor))
            self._bound_moves.append(lambda b: max(b, value))
        self._changes.append(lambda row: WholeRow(row, self.ids, None).change(token, kind, factor))

    def draw(self, temperature: float, top_k: int, top_p: float, step_seed: int) -> int | DrawRequest:
        top = self.row.candidates
        if top.values.size:
            bound = max(top.values[-1], self.tail_bound)
            for move in self._bound_moves:
                bound = move(bound)
            if temperature == 0.0:
                token = argmax_among(self.current, top.ids, bound)
                if token is not None:
                    return token
            elif (picked := top_k_among(self.current, top.ids, top_k, bound)) is not None:
                return DrawRequest(*picked, temperature, top_p, step_seed)
        whole = self.row.full()
        for change in self._changes:
            change(whole)
        hint = None if self._bound_moves else top
        return filtered_draw(whole, temperature, top_k, top_p, step_seed, hint)


class _Fixed:
    """A frozen copy of the penalty window's tokens (replayed after the window moved on)."""

    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def tokens(self) -> list[int]:
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)
