"""GPU runner fixtures: a tiny random Qwen3 on the CPU (the oracle) and GPU copies of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from gpu_models import GPU_TINY, build_cpu_model

from backends.models.qwen3 import Qwen3ForCausalLM


@pytest.fixture(scope="module")
def cpu_model() -> Qwen3ForCausalLM:
    return build_cpu_model()


@pytest.fixture(scope="module")
def make_gpu_model(cpu_model: Qwen3ForCausalLM) -> Callable[[torch.dtype], Qwen3ForCausalLM]:
    def build(dtype: torch.dtype) -> Qwen3ForCausalLM:
        model = Qwen3ForCausalLM(GPU_TINY).eval()
        model.load_state_dict(cpu_model.state_dict())
        return model.to(device="cuda", dtype=dtype)

    return build
