"""Exact draws of the duplex policy on one host logits row, at linear cost.

The policy samples every Thinker token on the host (its rules read the session's state), so
its per-token cost multiplies with the sessions of a step. On a 151,936-entry row (one CPU
core) a full-vocabulary sort for top-p took ~12 ms and float64 Gumbel noise over the row ~1 ms
per draw. Here each full-row pass is linear (masked fill, top-k, logsumexp) and the rest works
on the top-k survivors only:

- `boundary_hit` (rule 4): "a categorical draw from softmax(row) is `token`" is a Bernoulli
  draw with p = softmax(row)[token]: one uniform, same distribution as a whole-row draw;
- `filtered_draw` (rule 5): temperature, top-k (ties at the k-th value kept), top-p, then the
  Gumbel-max draw over the survivors with the runner's counter-based noise keyed on (step
  seed, token id) (`device_sampler.uniform_at`): the very draw a whole-row argmax of
  (filtered logits + noise) makes, since filtered-out tokens sit at -inf.
"""

from __future__ import annotations

import torch

from backends.runner.device_sampler import uniform_at

_BOUNDARY_KEY = -1  # the uniform of the rule-4 draw; token noise uses ids >= 0


def _uniforms(step_seed: int, token_ids: torch.Tensor) -> torch.Tensor:
    seed = torch.tensor(step_seed, dtype=torch.int64, device=token_ids.device)
    return uniform_at(seed, token_ids)


def boundary_hit(row: torch.Tensor, token: int, greedy: bool, step_seed: int) -> bool:
    """row: [vocab] float32 raw logits -> whether the step's raw-softmax draw is `token`."""
    if greedy:
        return int(torch.argmax(row)) == token
    log_p = row[token] - torch.logsumexp(row, dim=0)
    key = torch.tensor([_BOUNDARY_KEY], dtype=torch.int64, device=row.device)
    return bool(_uniforms(step_seed, key)[0] < torch.exp(log_p))


def filtered_draw(
    row: torch.Tensor, temperature: float, top_k: int, top_p: float, step_seed: int
) -> int:
    """row: [vocab] float32 logits, masked and penalised -> one token (argmax when greedy)."""
    if temperature == 0.0:
        return int(torch.argmax(row))
    values, ids = _top_k_with_ties(row, top_k)
    keep = values > float("-inf")
    values, ids = values[keep], ids[keep]
    scaled = values / temperature
    if top_p < 1.0:
        probs = torch.softmax(scaled, dim=0)
        mass_before = torch.cumsum(probs, dim=0) - probs
        keep = mass_before < top_p  # never drops the most likely token (mass_before = 0)
        scaled, ids = scaled[keep], ids[keep]
    if ids.numel() == 0:  # every logit is -inf: as a whole-row argmax would, take the first
        return 0
    noise = -torch.log(-torch.log(_uniforms(step_seed, ids)))
    return int(ids[torch.argmax(scaled + noise)])


def _top_k_with_ties(row: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits and their ids, descending, plus any tied with the k-th."""
    vocab = row.shape[0]
    if top_k < 1 or top_k >= vocab:
        return torch.sort(row, descending=True)
    values, ids = torch.topk(row, top_k + 1)
    kth = values[-2]
    if values[-1] < kth or kth == float("-inf"):  # no finite tie with the k-th beyond it
        return values[:-1], ids[:-1]
    tied = torch.nonzero(row >= kth).flatten()
    order = torch.argsort(row[tied], descending=True, stable=True)
    return row[tied][order], tied[order]
