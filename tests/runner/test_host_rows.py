"""A step's host-sampled rows: whole, or as a summary (`host_rows.CompactRow`) for hooks that
draw from one. The summary must hold the raw row's exact values (candidates, probes, tail
maximum, logsumexp), its `argmax` and `value` must be the row's, and `full` must give back the
raw row even after the step's buffers were reused. Through the fast path (Triton's interpreter
on CPU), compact rows must give the tokens whole rows give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.runner.host_draws import TOP_CANDIDATES, TopCandidates
from backends.runner.host_rows import CompactRow, HostRows, wants_compact
from backends.runner.types import SampleContext, SamplingParams, StepInput

VOCAB = 300
LIMIT = 280
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Triton's interpreter


def _rows(seed: int = 0, count: int = 3) -> torch.Tensor:
    return torch.randn(count, VOCAB, generator=torch.Generator().manual_seed(seed))


def _host(rows: HostRows) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in rows.outputs.items()}


def test_summaries_hold_the_raw_rows_values() -> None:
    logits = _rows()
    rows = HostRows(logits, [True, False, True], LIMIT, (7, 290), with_candidates=False)
    assert rows.outputs["host_logits"].shape == (1, VOCAB)  # only the whole row comes whole
    host = _host(rows)
    whole = rows.row(1, host)
    assert isinstance(whole, torch.Tensor) and torch.equal(whole, logits[1])
    for k in (0, 2):
        row, raw = rows.row(k, host), logits[k]
        assert isinstance(row, CompactRow)
        top = torch.topk(raw[:LIMIT], TOP_CANDIDATES)
        assert np.array_equal(row.candidates.values, top.values.numpy())
        assert set(row.candidates.ids.tolist()) == set(top.indices.tolist())
        assert row.candidates.limit == LIMIT and row.vocab == VOCAB
        # reduced over the step's rows at once: the same sum up to its order (a few ulps)
        assert row.logsumexp == pytest.approx(torch.logsumexp(raw, dim=0).item(), rel=1e-6)
        assert row.probes == {7: raw[7].item(), 290: raw[290].item()}
        assert row.tail_max == raw[LIMIT:].max().item()


def test_full_gives_the_raw_row_after_the_step_buffers_are_reused() -> None:
    logits = _rows(1)
    expected = logits.clone()
    rows = HostRows(logits, [True, True, True], 0, (), with_candidates=False)
    host = _host(rows)
    logits.fill_(0.0)  # the next graph replay writes the same static buffer
    row = rows.row(2, host)
    assert torch.equal(row.full(), expected[2])
    row.full()[0] = 123.0  # each call is a new copy, the caller's to change
    assert torch.equal(row.full(), expected[2])
    assert row.tail_max == -np.inf and "tail_max" not in host  # no limit: no tail


def _summary(raw: torch.Tensor, limit: int, count: int, fetches: list[int]) -> CompactRow:
    top = torch.topk(raw[:limit], count)

    def fetch() -> torch.Tensor:
        fetches.append(1)
        return raw.clone()

    tail = raw[limit:].max() if limit < raw.shape[0] else torch.tensor(float("-inf"))
    return CompactRow(
        TopCandidates(top.values.numpy(), top.indices.numpy(), limit),
        torch.logsumexp(raw, dim=0).numpy()[()], {}, tail.numpy()[()], raw.shape[0], fetch,
    )


@pytest.mark.parametrize("count", [1, 4, 40])
def test_value_and_argmax_are_the_rows(count: int) -> None:
    generator = torch.Generator().manual_seed(2)
    for case in range(60):
        raw = torch.randint(-3, 4, (VOCAB,), generator=generator).float()  # many ties
        if case % 3 == 0:
            raw[LIMIT + case % (VOCAB - LIMIT)] = 9.0  # the largest past the limit
        fetches: list[int] = []
        row = _summary(raw, LIMIT, count, fetches)
        assert row.argmax() == int(torch.argmax(raw)), case
        for token in (0, 5, int(row.candidates.ids[0]), LIMIT + 1):
            assert row.value(token) == raw[token].item()


def test_argmax_decides_from_the_candidates_when_they_can() -> None:
    raw = torch.arange(VOCAB, dtype=torch.float32).flip(0)  # id 0 the largest, no ties
    fetches: list[int] = []
    assert _summary(raw, LIMIT, 8, fetches).argmax() == 0 and not fetches


class _Hook:
    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


class _CompactHook(_Hook):
    def before_sample_compact(self, row: CompactRow, ctx: SampleContext) -> int | None:
        return None


def test_which_rows_go_compact() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert wants_compact(True, cpu, _CompactHook(), 1.0)
    assert wants_compact(False, cuda, _CompactHook(), 1.0)
    assert not wants_compact(False, cpu, _CompactHook(), 1.0)  # a CPU row costs no copy
    assert not wants_compact(True, cpu, _Hook(), 1.0)  # the hook cannot take a summary
    assert not wants_compact(True, cpu, _CompactHook(), 1.1)  # the runner penalises the row
    assert not wants_compact(False, cuda, _CompactHook(), 1.1)


class _ArgmaxHook(_Hook):
    """Forces the raw argmax, from whichever form of the row it gets; records the forms."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        self.seen.append("whole")
        return int(torch.argmax(logits))

    def before_sample_compact(self, row: CompactRow, ctx: SampleContext) -> int | None:
        self.seen.append("compact")
        return row.argmax()


@pytest.mark.interpreter
def test_fast_path_compact_rows_draw_as_whole_rows(make_runner) -> None:
    pytest.importorskip("triton")
    settings = dict(num_blocks=64, max_num_reqs=4, max_model_len=48, attention_backend="triton")
    results, hooks = [], []
    for on_cpu in (False, True):
        runner = make_runner(compact_rows_on_cpu=on_cpu, **settings)
        argmax, undecided = _ArgmaxHook(), _CompactHook()  # undecided: the runner draws
        hooks.append((argmax, undecided))
        sampled = SamplingParams(temperature=0.8, top_k=5, seed=3)
        runner.add_request("a", SamplingParams(), hook=argmax)
        runner.add_request("b", sampled, hook=undecided)
        runner.add_request("c", sampled)  # no hook: drawn on the device either way
        inputs = [StepInput("a", [1, 2, 3]), StepInput("b", [4, 5]), StepInput("c", [6])]
        tokens = []
        for _ in range(4):
            step = [r.token for r in runner.step(inputs)]
            tokens.append(step)
            inputs = [StepInput(rid, [t]) for rid, t in zip("abc", step)]
        results.append(tokens)
    assert results[0] == results[1]
    assert hooks[0][0].seen == ["whole"] * 4 and hooks[1][0].seen == ["compact"] * 4
