"""Shared fixtures for the runner tests: a tiny random-weight Qwen3 twin pair (ours + HF's)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
import transformers

from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig

if not torch.cuda.is_available():
    # The fast path's Triton kernels run in Triton's interpreter on CPU. The switch is read
    # when a kernel is defined, so it must be set before any test imports them.
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY_DIMS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=300,
    rope_theta=10_000.0,
)
# Wider than HF's 0.02 default so the top logits of random weights are well separated and a
# greedy comparison is not decided by float32 rounding noise.
INIT_RANGE = 0.2


def build_hf_qwen3(num_layers: int) -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(1234)
    dims = {**TINY_DIMS, "num_hidden_layers": num_layers}
    config = transformers.Qwen3Config(**dims, initializer_range=INIT_RANGE)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # HF inits norms to 1; randomise them so a missed norm shows up
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def twin_of(hf_model: transformers.Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    dims = {**TINY_DIMS, "num_hidden_layers": hf_model.config.num_hidden_layers}
    model = Qwen3ForCausalLM(Qwen3Config(**dims)).eval()
    model.load_state_dict(hf_model.state_dict())
    return model


@pytest.fixture(scope="session")
def hf_qwen3() -> transformers.Qwen3ForCausalLM:
    return build_hf_qwen3(TINY_DIMS["num_hidden_layers"])


@pytest.fixture(scope="session")
def qwen3(hf_qwen3: transformers.Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    return twin_of(hf_qwen3)


@pytest.fixture(scope="session")
def qwen3_one_layer() -> Qwen3ForCausalLM:
    """With one layer every cached K/V depends only on its token and position, so a re-anchored
    cache must equal a fresh prefill of the retained tokens exactly."""
    return twin_of(build_hf_qwen3(1))


@pytest.fixture
def make_runner(qwen3: Qwen3ForCausalLM) -> Callable[..., ModelRunner]:
    """A fresh runner over the shared weights; block size 4 so short prompts cross pages."""

    def build(model: Qwen3ForCausalLM = qwen3, **overrides: object) -> ModelRunner:
        settings: dict[str, object] = dict(
            num_blocks=256, max_num_reqs=8, max_model_len=128, block_size=4
        )
        settings.update(overrides)
        return ModelRunner(model, RunnerConfig(**settings))  # type: ignore[arg-type]

    return build
