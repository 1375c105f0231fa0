"""Per-request sampling: a pure function of (seed, position, logits, generated history).

Each sampled row's Gumbel noise is a counter-based function of (request seed, position, token
id) (`device_sampler.uniform_at`, the same noise the device sampler draws; the draw itself is
`host_draws.filtered_draw`, linear in the vocabulary), so a request's tokens never depend on
which other requests share the batch, on batch order, on slot or on device. Hooks key their own
draws the same way (`step_seed`).
Order per row (vLLM's): float32 copy ->
repetition penalty -> hook.before_sample (may force a token) -> temperature -> top-k ->
top-p -> Gumbel-max (plain argmax when temperature is 0) -> hook.after_sample.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.host_draws import DrawSteps, filtered_draw, run_alone
from backends.runner.host_rows import CompactRow
from backends.runner.types import SampleContext, SamplingHook, SamplingParams

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A 64-bit bijective mixer: nearby (seed, position) pairs give unrelated streams."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, position: int) -> int:
    """The 63-bit generator seed for the token sampled at `position` (fits manual_seed)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64)) >> 1


def apply_repetition_penalty(
    logits: torch.Tensor, generated: list[int], penalty: float, window: int
) -> None:
    """HF-style, in place on logits [vocab] float32: each distinct token among the last `window`
    generated (all when 0) has its logit divided by `penalty` if positive, multiplied if not."""
    if penalty == 1.0 or not generated:
        return
    recent = generated[-window:] if window > 0 else generated
    if logits.device.type == "cpu":  # a host row: numpy, ~5x fewer dispatches, same float32 math
        row = logits.numpy()
        host_ids = np.fromiter(set(recent), dtype=np.int64)
        host_ids = host_ids[host_ids < row.shape[0]]
        kept = row[host_ids]
        row[host_ids] = np.where(kept > 0, kept / np.float32(penalty), kept * np.float32(penalty))
        return
    ids = torch.tensor(sorted(set(recent)), dtype=torch.int64, device=logits.device)
    ids = ids[ids < logits.shape[0]]
    picked = logits[ids]
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)


# apply_top_k / apply_top_p: the filters as whole-row masks, the definition the tests hold the
# device sampler and the linear-cost host draw (`host_draws.filtered_draw`) to.


def apply_top_k(logits: torch.Tensor, top_k: int) -> None:
    """In place on [vocab]: keep the top_k largest logits (ties at the k-th value kept)."""
    if top_k < 1 or top_k >= logits.shape[0]:
        return
    kth_value = torch.topk(logits, top_k).values[-1]
    logits.masked_fill_(logits < kth_value, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> None:
    """In place on [vocab]: keep the smallest set of most likely tokens whose mass >= top_p."""
    if top_p >= 1.0:
        return
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p  # never drops the most likely token (mass_before = 0)
    drop = torch.zeros_like(drop_sorted).scatter_(0, order, drop_sorted)
    logits.masked_fill_(drop, float("-inf"))


def sample_token(
    logits: torch.Tensor | CompactRow,
    params: SamplingParams,
    ctx: SampleContext,
    hook: SamplingHook | None,
    owned: bool = False,
) -> int:
    """logits: [vocab] (or a hooked row's summary, `host_rows.CompactRow`) -> the final token
    for one request. The row is not modified unless `owned` (a float32 row that is the
    caller's to give away, as a step's host copy of its logits: the masks and the penalty then
    work on it without a 600 KB copy)."""
    if isinstance(logits, CompactRow):
        return run_alone(_compact_steps(logits, params, ctx, hook))
    row = logits if owned and logits.dtype == torch.float32 else logits.to(torch.float32, copy=True)
    apply_repetition_penalty(row, ctx.generated, params.repetition_penalty, params.penalty_window)
    forced = hook.before_sample(row, ctx) if hook is not None else None
    token = forced if forced is not None else _draw(row, params, ctx, hook is not None)
    return hook.after_sample(token, ctx) if hook is not None else token


def sample_steps(
    logits: torch.Tensor | CompactRow,
    params: SamplingParams,
    ctx: SampleContext,
    hook: SamplingHook | None,
    owned: bool = False,
) -> DrawSteps:
    """`sample_token` as steps: a summary's draw, where its hook yields it (`decide_compact`),
    is left to the caller, who may make a step's draws together (`host_draws.run_together`)."""
    if isinstance(logits, CompactRow):
        return (yield from _compact_steps(logits, params, ctx, hook))
    return sample_token(logits, params, ctx, hook, owned)


def _compact_steps(
    row: CompactRow, params: SamplingParams, ctx: SampleContext, hook: SamplingHook | None
) -> DrawSteps:
    """A summary comes only for a hook that offers `before_sample_compact` and a row without
    the runner's own penalty (`host_rows.wants_compact`); undecided, it draws on the row."""
    if hook is None or params.repetition_penalty != 1.0:
        raise ValueError("a compact row needs its hook and no runner repetition penalty")
    steps = getattr(hook, "decide_compact", None)
    if steps is not None:
        forced = yield from steps(row, ctx)
    else:
        forced = hook.before_sample_compact(row, ctx)  # type: ignore[attr-defined]
    token = forced if forced is not None else _draw(row.full(), params, ctx, hooked=True)
    return hook.after_sample(token, ctx)


def _draw(row: torch.Tensor, params: SamplingParams, ctx: SampleContext, hooked: bool) -> int:
    seed = step_seed(params.seed, ctx.position)
    # The raw top candidates hold only while every change to the row lowered logits: a hook
    # may have raised one, and so does a repetition penalty below 1.
    lowered = not hooked and params.repetition_penalty >= 1.0
    hint = ctx.candidates if lowered else None
    return filtered_draw(row, params.temperature, params.top_k, params.top_p, seed, hint)
