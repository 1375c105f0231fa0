"""The duplex policy on the runner's summary of a row (`before_sample_compact`) must draw
exactly the tokens it draws on the whole row (`before_sample`, with the raw top candidates the
fast path hands it), for every rule: forced tokens, the boundary draw (sampled and greedy), the
masks, the repetition penalty (>= 1 and < 1), the listen scale and the turn_eos length
penalty, temperature / top-k / top-p and the knob's
replies. With few candidates the summary often cannot decide and fetches the row: the draws
must not change, and with the runner's 128 it must rarely need to."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.runner.host_draws import TOP_CANDIDATES, TopCandidates, run_together
from backends.runner.host_rows import CompactRow, HostRows
from backends.runner.types import SampleContext
from backends.thinker.duplex_policy import DuplexPolicy
from backends.thinker.policy_config import PolicyConfig
from backends.thinker.isolating_hook import IsolatingHook

VOCAB = 1024  # the tiny tokenizer's 1000 ids + 24 rows of embedding padding
LIMIT = 1000
BAD_IDS = range(LIMIT, VOCAB)


def _ctx(position: int, candidates: TopCandidates | None = None) -> SampleContext:
    return SampleContext("r", position, [], candidates)


def _summary(raw: torch.Tensor, count: int, probes: tuple[int, ...], fetches: list[int]) -> CompactRow:
    """The fast path's summary of `raw` (HostRows on a CPU row), with its `count` largest
    candidates kept and its row fetches counted."""
    rows = HostRows(raw[None], [True], LIMIT, probes, with_candidates=False)
    row = rows.row(0, {name: t.clone() for name, t in rows.outputs.items()})
    assert isinstance(row, CompactRow)
    top = row.candidates
    row.candidates = TopCandidates(top.values[:count], top.ids[:count], top.limit)
    fetch = row.fetch
    row.fetch = lambda: fetches.append(1) or fetch()
    return row


def _rows(special: SpecialTokens, seed: int, hot: bool) -> Callable[[], torch.Tensor]:
    """Random rows, some with the policy's special ids and the padding pushed to the top (the
    masks then take the largest candidates away) and some with chunk_eos likely."""
    generator = torch.Generator().manual_seed(seed)

    def make() -> torch.Tensor:
        row = torch.randn(VOCAB, generator=generator) * 2.0
        if hot:
            row[LIMIT:] += 6.0
            for token in (special.listen, special.speak, special.turn_eos, special.tts_pad):
                row[token] = 7.0
        if torch.rand((), generator=generator) < 0.2:
            row[special.chunk_eos] = 5.0
        return row

    return make


def _pair(tokenizer: TextTokenizer, special: SpecialTokens, **cfg: object) -> list[DuplexPolicy]:
    config = PolicyConfig(**cfg)  # type: ignore[arg-type]
    return [DuplexPolicy(special, tokenizer, config, BAD_IDS, seed=5) for _ in range(2)]


def _run(
    policies: list[DuplexPolicy], special: SpecialTokens, rows: Callable[[], torch.Tensor],
    count: int, units: int = 12,
) -> tuple[list[list[int]], int]:
    """The same units on both policies: whole rows to the first, summaries to the second."""
    whole_policy, compact_policy = policies
    hooks = [IsolatingHook(p, special.chunk_eos) for p in policies]
    out: list[list[int]] = [[], []]
    fetches: list[int] = []
    position = 50
    for policy in policies:
        policy.open_turn_with_text()
    for unit in range(units):
        speech = [unit % 3 == 0]
        for policy in policies:
            policy.begin_unit(False, speech)
        for _ in range(whole_policy.config.max_tokens_per_unit):
            raw = rows()
            top = torch.topk(raw[:LIMIT], TOP_CANDIDATES)
            hint = TopCandidates(top.values.numpy(), top.indices.numpy(), LIMIT)
            ctx = _ctx(position, hint)
            token = hooks[0].before_sample(raw.clone(), ctx)
            out[0].append(hooks[0].after_sample(token, ctx))
            row = _summary(raw, count, (special.chunk_eos,), fetches)
            token = hooks[1].before_sample_compact(row, _ctx(position))
            out[1].append(hooks[1].after_sample(token, _ctx(position)))
            position += 1
            if out[0][-1] in whole_policy.terminators:
                break
        assert out[0] == out[1], unit
        assert hooks[0].error is None and hooks[1].error is None
    assert compact_policy.latches == whole_policy.latches
    return out, len(fetches)


@pytest.mark.parametrize("hot", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"temperature": 0.0},
        {"repetition_penalty": 1.3, "penalty_window": 8},
        {"repetition_penalty": 0.8},  # raises logits: the candidates cannot serve
        {"listen_prob_scale": 3.0, "length_penalty": 0.5},  # both may raise one id's logit
        {"temperature": 1.0, "top_p": 1.0, "top_k": 5},
        {"reply_units": 2, "reply_tokens_per_unit": 4},
    ],
)
def test_summary_draws_equal_whole_row_draws(tokenizer, special, cfg, hot) -> None:
    for count in (3, 24, TOP_CANDIDATES):
        _run(_pair(tokenizer, special, **cfg), special, _rows(special, 7, hot), count)


def test_the_summary_decides_alone_with_the_runners_candidates(tokenizer, special) -> None:
    for hot in (False, True):
        tokens, fetches = _run(_pair(tokenizer, special), special, _rows(special, 3, hot),
                               TOP_CANDIDATES, units=30)
        assert fetches == 0 and len(tokens[0]) > 60
    tokens, fetches = _run(_pair(tokenizer, special), special, _rows(special, 3, True), 3)
    assert fetches > len(tokens[0]) // 4  # three candidates, mostly masked: fetched


def test_a_greedy_boundary_with_the_largest_logit_in_the_padding(tokenizer, special) -> None:
    """The raw argmax lies past the candidates' limit: the summary must see it there."""
    policies = _pair(tokenizer, special, temperature=0.0)

    def make() -> torch.Tensor:
        row = torch.zeros(VOCAB)
        row[special.chunk_eos], row[LIMIT + 3] = 5.0, 6.0
        return row

    tokens, _ = _run(policies, special, make, TOP_CANDIDATES, units=2)
    assert tokens[0][0] != special.chunk_eos  # padding wins the raw argmax: no boundary


def test_rows_drawn_together_draw_as_alone_and_keep_their_failures(tokenizer, special) -> None:
    """The fast path makes a step's yielded draws together (`run_together`): every session
    gets the tokens it gets alone, and a policy failing after its draw (rule 6 here) fails
    only its own row, as the hook's `before_sample_compact` would."""
    alone = [DuplexPolicy(special, tokenizer, PolicyConfig(), BAD_IDS, seed=s) for s in range(4)]
    together = [DuplexPolicy(special, tokenizer, PolicyConfig(), BAD_IDS, seed=s) for s in range(4)]
    broken = DuplexPolicy(special, tokenizer, PolicyConfig(), BAD_IDS, seed=9)
    broken._reaches_char_limit = lambda candidate: 1 / 0  # type: ignore[method-assign]
    for policy in [*alone, *together, broken]:
        policy.open_turn_with_text()
        policy.begin_unit(False, [False])
    hooks = [IsolatingHook(p, special.chunk_eos) for p in [*together, broken]]
    rows, drawn, yielded = _rows(special, 11, False), [[], []], 0
    for position in range(60, 72):
        raws = [rows() for _ in alone]
        ctx = _ctx(position)
        for policy, raw in zip(alone, raws):
            token = policy.before_sample_compact(_summary(raw, TOP_CANDIDATES, (special.chunk_eos,), []), ctx)
            drawn[0].append(policy.after_sample(token, ctx))
        steps = [h.decide_compact(_summary(raw, TOP_CANDIDATES, (special.chunk_eos,), []), ctx)
                 for h, raw in zip(hooks, [*raws, raws[0]])]
        counted = [_Counting(s) for s in steps]
        tokens = run_together(counted)
        yielded += sum(c.asked for c in counted)
        drawn[1] += [h.after_sample(t, ctx) for h, t in zip(hooks[:-1], tokens[:-1])]
        assert tokens[-1] == special.chunk_eos and isinstance(hooks[-1].error, ZeroDivisionError)
        for policy in [*alone, *together]:
            if policy.unit_tokens and policy.unit_tokens[-1] in policy.terminators:
                policy.begin_unit(False, [False])
    assert drawn[0] == drawn[1] and yielded > 20
    assert all(h.error is None for h in hooks[:-1])


class _Counting:
    """Steps that count the draws they yield."""

    def __init__(self, steps) -> None:
        self.steps, self.asked = steps, 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        request = self.steps.send(value)
        self.asked += 1
        return request
