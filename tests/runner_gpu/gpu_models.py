"""Tiny random Qwen3 and runner factories for the GPU tests (no transformers needed there)."""

from __future__ import annotations

import torch

from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig

GPU_TINY = Qwen3Config(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=512,
    rope_theta=10_000.0,
)
INIT_STD = 0.2  # wide, so greedy top logits are well separated (as in tests/runner)


def build_cpu_model() -> Qwen3ForCausalLM:
    torch.manual_seed(4321)
    model = Qwen3ForCausalLM(GPU_TINY).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, INIT_STD)
    return model


def runner_for(model: Qwen3ForCausalLM, **overrides: object) -> ModelRunner:
    device = next(model.parameters()).device
    settings: dict[str, object] = dict(
        num_blocks=96, max_num_reqs=8, max_model_len=128, block_size=16,
        device=str(device), dtype=next(model.parameters()).dtype,
        attention_backend="triton" if device.type == "cuda" else "reference",
    )  # fmt: skip
    settings.update(overrides)
    return ModelRunner(model, RunnerConfig(**settings))  # type: ignore[arg-type]
