"""Hooked rows on the GPU fast path come with their top candidates from one device top-k.

A hook (the Thinker's duplex policy) draws on a host copy of its logits row; the runner also
hands it the row's largest logits and their ids (`SampleContext.candidates`), taken on the
device for all hooked rows of the step, so the draw skips its own top-k over the row. What must
hold, prefill then graphed decodes: the candidates are the row's top-k as the hook receives it,
and a draw after the hook's masks gives the same token with them as without. Skipped without
CUDA.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402

from backends.runner.host_draws import TOP_CANDIDATES, filtered_draw  # noqa: E402
from backends.runner.sampler import step_seed  # noqa: E402
from backends.runner.types import SampleContext, SamplingParams, StepInput  # noqa: E402


class CheckingHook:
    """Masks a few of the top ids, then draws with and without the runner's candidates."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.draws = 0

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        hint = ctx.candidates
        assert hint is not None and logits.device.type == "cpu"
        top = torch.topk(logits, TOP_CANDIDATES)
        assert torch.equal(torch.from_numpy(hint.values), top.values)
        assert set(hint.ids.tolist()) == set(top.indices.tolist())
        logits[top.indices[[0, 3]]] = float("-inf")
        seed = step_seed(11, ctx.position)
        token = filtered_draw(logits, self.temperature, 20, 0.9, seed, hint)
        assert token == filtered_draw(logits, self.temperature, 20, 0.9, seed)
        self.draws += 1
        return token

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        return token


def test_hooked_rows_draw_the_same_with_their_device_candidates(make_gpu_model) -> None:
    runner = runner_for(make_gpu_model(torch.float32))
    hooks = [CheckingHook(0.7), CheckingHook(1.3)]
    for i, hook in enumerate(hooks):
        runner.add_request(f"r{i}", SamplingParams(), hook=hook)
    results = runner.step([StepInput(f"r{i}", list(range(5 + i, 30))) for i in range(2)])
    for _ in range(6):
        results = runner.step([StepInput(r.request_id, [r.token]) for r in results])
    assert [hook.draws for hook in hooks] == [7, 7]
