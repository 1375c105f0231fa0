"""On CUDA a hook that draws from a summary gets its rows compact (`host_rows.CompactRow`), and
the summary is the raw row's: the device top candidates, logsumexp, probe values and tail
maximum of the row `full()` fetches, queued without a host sync. A draw after masking two top
ids and the tail gives from the summary the token the whole masked row gives. Prefill, then graphed
decodes. Skipped without CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import GPU_TINY, runner_for  # noqa: E402
from no_sync import launch_without_host_sync  # noqa: E402

from backends.runner.host_draws import (  # noqa: E402
    TOP_CANDIDATES,
    draw_among,
    filtered_draw,
    top_k_among,
)
from backends.runner.host_rows import CompactRow  # noqa: E402
from backends.runner.sampler import step_seed  # noqa: E402
from backends.runner.types import SampleContext, SamplingParams, StepInput  # noqa: E402

LIMIT = GPU_TINY.vocab_size - 12  # ids past it: the "padding" tail
PROBE = 7


class SummaryHook:
    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.draws = 0

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        raise AssertionError("a hook that takes summaries got a whole row on CUDA")

    def before_sample_compact(self, row: CompactRow, ctx: SampleContext) -> int | None:
        whole = row.full()
        top = torch.topk(whole[:LIMIT], TOP_CANDIDATES)
        assert torch.equal(torch.from_numpy(row.candidates.values), top.values)
        assert set(row.candidates.ids.tolist()) == set(top.indices.tolist())
        assert row.logsumexp == pytest.approx(torch.logsumexp(whole, 0).item(), rel=1e-5)
        assert row.probes == {PROBE: whole[PROBE].item()}
        assert row.tail_max == whole[LIMIT:].max().item()
        masked = row.candidates.ids[[0, 3]]
        current = np.where(np.isin(row.candidates.ids, masked), -np.inf, row.candidates.values)
        seed = step_seed(11, ctx.position)
        bound = row.candidates.values[-1]  # the tail is masked too, as a policy masks padding
        picked = top_k_among(current.astype(np.float32), row.candidates.ids, 20, bound)
        assert picked is not None
        token = draw_among(*picked, self.temperature, 0.9, seed)
        whole[torch.from_numpy(masked)] = float("-inf")
        whole[LIMIT:] = float("-inf")
        assert token == filtered_draw(whole, self.temperature, 20, 0.9, seed)
        self.draws += 1
        return token

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


def test_hooks_that_take_summaries_get_the_raw_rows_summary(make_gpu_model) -> None:
    runner = runner_for(make_gpu_model(torch.float32), candidate_ids=LIMIT, probe_ids=(PROBE,))
    hooks = [SummaryHook(0.7), SummaryHook(1.3)]
    for i, hook in enumerate(hooks):
        runner.add_request(f"r{i}", SamplingParams(), hook=hook)
    inputs = [StepInput(f"r{i}", list(range(5 + i, 30))) for i in range(2)]
    for _ in range(7):
        results = launch_without_host_sync(runner, inputs).wait()
        inputs = [StepInput(r.request_id, [r.token]) for r in results]
    assert [hook.draws for hook in hooks] == [7, 7]
