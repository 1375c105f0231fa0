"""The duplex policy's operations on one logits row, whole or as a runner summary.

The policy reads the raw row once (the boundary draw, rule 4), then lowers logits (masks, the
repetition penalty) and draws (rule 5). `WholeRow` does that on the [vocab] host row, as the
runner's hooks always did. `SummaryRow` does it on a `host_rows.CompactRow`: the raw row's top
candidates, logsumexp and probe values. Masks and the penalty only ever lower logits, so every
id outside the candidates stays at most the smallest raw candidate (or, past their limit, the
raw tail's largest value, or -inf once a mask covers the tail): where the (k+1)-th lowered
candidate still beats that bound, the candidates alone hold the lowered row's top-k and the
draw is the whole row's draw, bit for bit (`host_draws.top_k_among`). Where it does not, the
summary fetches the whole raw row and replays the masks and the penalty on it.
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
from backends.runner.sampler import apply_repetition_penalty
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
        """The repetition penalty over the distinct ids of the penalty window."""
        ...

    def draw(
        self, temperature: float, top_k: int, top_p: float, step_seed: int, lowered: bool
    ) -> int | DrawRequest:
        """`host_draws.filtered_draw` of the row as changed so far; `lowered`: every change
        lowered logits (a penalty >= 1), so the raw top candidates may serve. Its last part,
        `draw_among` of the top-k, may come back as a `DrawRequest` for the caller to make."""
        ...


class WholeRow:
    def __init__(
        self, logits: torch.Tensor, ids: PolicyIds, candidates: TopCandidates | None
    ) -> None:
        self.logits = logits  # [vocab] float32, changed in place
        self.ids = ids
        self.candidates = candidates

    def boundary_hit(self, token: int, greedy: bool, step_seed: int) -> bool:
        return boundary_hit(self.logits, token, greedy, step_seed)

    def mask(self, id_set: str) -> None:
        self.ids.fill(self.logits, id_set)

    def penalise(self, recent: RecentTokens, penalty: float) -> None:
        apply_repetition_penalty(self.logits, recent.tokens(), penalty, 0)

    def draw(
        self, temperature: float, top_k: int, top_p: float, step_seed: int, lowered: bool
    ) -> int:
        hint = self.candidates if lowered else None
        return filtered_draw(self.logits, temperature, top_k, top_p, step_seed, hint)


class SummaryRow:
    def __init__(self, row: CompactRow, ids: PolicyIds) -> None:
        self.row = row
        self.ids = ids
        self.current = row.candidates.values.copy()  # the candidates' values as changed
        self.tail_bound = row.tail_max  # bounds every id past the candidates' limit
        self._changes: list[Callable[[torch.Tensor], None]] = []  # replayed on a fetched row

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
        kept = self.current[hit]  # the float32 arithmetic of `apply_repetition_penalty`
        factor = np.float32(penalty)
        self.current[hit] = np.where(kept > 0, kept / factor, kept * factor)
        # replayed within this draw, before the policy adds the drawn token to `recent`
        self._changes.append(lambda row: apply_repetition_penalty(row, recent.tokens(), penalty, 0))

    def draw(
        self, temperature: float, top_k: int, top_p: float, step_seed: int, lowered: bool
    ) -> int | DrawRequest:
        top = self.row.candidates
        if lowered and top.values.size:
            bound = max(top.values[-1], self.tail_bound)
            if temperature == 0.0:
                token = argmax_among(self.current, top.ids, bound)
                if token is not None:
                    return token
            elif (picked := top_k_among(self.current, top.ids, top_k, bound)) is not None:
                return DrawRequest(*picked, temperature, top_p, step_seed)
        whole = self.row.full()
        for change in self._changes:
            change(whole)
        return filtered_draw(whole, temperature, top_k, top_p, step_seed, top if lowered else None)
