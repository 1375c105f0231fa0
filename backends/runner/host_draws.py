"""Exact draws on one host logits row at linear cost: the runner's host sampler and a stage's
sampling policy (the Thinker's duplex policy) draw here.

Per token on a 151,936-entry row (one CPU core), a full-vocabulary sort for top-p took ~12 ms
and float64 Gumbel noise over the row ~1 ms. Here each full-row pass is linear (top-k,
logsumexp) and the rest works on the top-k survivors only:

- `boundary_hit`: "a categorical draw from softmax(row) is `token`" is a Bernoulli draw with
  p = softmax(row)[token]: one uniform, the same distribution as a whole-row draw (the duplex
  policy's rule 4);
- `filtered_draw`: temperature, top-k (ties at the k-th value kept), top-p, then the
  Gumbel-max draw over the survivors with the counter-based noise keyed on (step seed, token
  id) (`device_sampler.uniform_at`): the very token a whole-row argmax of (filtered logits +
  noise) picks, as the device sampler does, since filtered-out tokens sit at -inf.
"""

from __future__ import annotations

import torch

from backends.runner.device_sampler import uniform_at

_BOUNDARY_KEY = -1  # the uniform of `boundary_hit`; token noise uses ids >= 0


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
    values, ids = _candidates(row, top_k, sort=top_p < 1.0)
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


def _candidates(row: torch.Tensor, top_k: int, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits and their ids, descending, plus any tied with the k-th; without
    top-k the whole row (sorted only if top-p needs the order)."""
    vocab = row.shape[0]
    if top_k < 1 or top_k >= vocab:
        if sort:
            return torch.sort(row, descending=True)
        return row, torch.arange(vocab, device=row.device)
    values, ids = torch.topk(row, top_k + 1)
    kth = values[-2]
    if values[-1] < kth or kth == float("-inf"):  # no finite tie with the k-th beyond it
        return values[:-1], ids[:-1]
    tied = torch.nonzero(row >= kth).flatten()
    order = torch.argsort(row[tied], descending=True, stable=True)
    return row[tied][order], tied[order]
