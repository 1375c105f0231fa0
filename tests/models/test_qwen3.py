"""Qwen3ForCausalLM (ours) vs transformers' Qwen3ForCausalLM with the same random weights.

Strategy: the HF state dict must load strictly (names and shapes identical), and a forward
through the paged runner — token rows and injected embedding rows — must reproduce HF's final
hidden states and logits for every position. Norm weights are randomised so a skipped or
misplaced norm (QK-norm before RoPE) cannot hide behind all-ones weights.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig, SamplingParams, StepInput

DIMS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=300,
    rope_theta=1_000_000.0,
)
# float32 throughout; only summation order differs from HF's SDPA path.
ATOL = 1e-4


@pytest.fixture(scope="module")
def twins() -> tuple[transformers.Qwen3ForCausalLM, Qwen3ForCausalLM]:
    torch.manual_seed(7)
    hf = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**DIMS, initializer_range=0.2)
    ).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    ours = Qwen3ForCausalLM(Qwen3Config(**DIMS)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


def test_parameter_names_equal_hf(twins) -> None:
    hf, ours = twins
    ours_shapes = {k: v.shape for k, v in ours.state_dict().items()}
    assert ours_shapes == {k: v.shape for k, v in hf.state_dict().items()}
    assert "model.layers.1.self_attn.q_norm.weight" in ours_shapes
    assert "lm_head.weight" in ours_shapes


def test_forward_with_injected_rows_matches_hf(twins) -> None:
    hf, ours = twins
    ids = torch.randint(0, 300, (23,), generator=torch.Generator().manual_seed(1))
    embeds = hf.model.embed_tokens(ids).detach() + 0.1  # not any token's embedding
    config = RunnerConfig(num_blocks=8, max_num_reqs=1, max_model_len=32, block_size=4)
    runner = ModelRunner(ours, config)
    runner.add_request("r", SamplingParams())
    head = ids[:9].tolist()
    first = runner.step([StepInput("r", head, None, sample=False, capture_hidden=True)])
    rest = runner.step([StepInput("r", [0] * 14, embeds[9:], capture_hidden=True)])
    hidden = torch.cat([first[0].hidden, rest[0].hidden])
    mixed = torch.cat([hf.model.embed_tokens(ids[:9]), embeds[9:]]).detach()
    with torch.no_grad():
        out = hf(inputs_embeds=mixed[None], output_hidden_states=True)
    torch.testing.assert_close(hidden, out.hidden_states[-1][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.compute_logits(hidden), out.logits[0], atol=ATOL, rtol=0)
    assert ours.compute_logits(hidden).dtype == torch.float32


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"num_key_value_heads": 3}, "multiple of num_kv_heads"),
        ({"head_dim": 15}, "even"),
        ({"vocab_size": 0}, "Qwen3Config.vocab_size"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ],
)
def test_config_rejects_bad_geometry(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Qwen3Config(**{**DIMS, **overrides})  # type: ignore[arg-type]
