"""LlamaBackbone (ours) vs transformers' LlamaModel, with a plain Linear head on both.

Strategy: the LlamaModel state dict must load strictly into the backbone; greedy generation
through the paged runner must equal a greedy loop over HF's full contiguous forward, token for
token, for one request alone and for 8 requests with different prompt lengths and chunking
sharing every step. Norm weights are randomised so a skipped norm cannot hide.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from backends.models.llama import LlamaBackbone, LlamaBackboneConfig, LlamaWithHead
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig, SamplingParams, StepInput

DIMS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=300,
    rope_theta=10_000.0,
)
HEAD_VOCAB = 200  # the head's vocabulary differs from the backbone's table, as the Talker's does
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def twins() -> tuple[transformers.LlamaModel, nn.Linear, LlamaWithHead]:
    torch.manual_seed(11)
    hf = transformers.LlamaModel(transformers.LlamaConfig(**DIMS, initializer_range=0.2)).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    head = nn.Linear(64, HEAD_VOCAB, bias=False)
    backbone = LlamaBackbone(LlamaBackboneConfig(**DIMS))
    backbone.load_state_dict(hf.state_dict(), strict=True)
    return hf, head, LlamaWithHead(backbone, head).eval()


def hf_greedy(hf: transformers.LlamaModel, head: nn.Linear, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            hidden = hf(torch.tensor([ids])).last_hidden_state[0, -1]
            ids.append(int(head(hidden).argmax()))
    return ids[-n:]


def make_runner(model: LlamaWithHead) -> ModelRunner:
    config = RunnerConfig(num_blocks=128, max_num_reqs=8, max_model_len=64, block_size=4)
    return ModelRunner(model, config)


def test_parameter_names_equal_hf(twins) -> None:
    hf, _, model = twins
    backbone_keys = {k for k in model.state_dict() if k.startswith("backbone.")}
    assert backbone_keys == {f"backbone.{k}" for k in hf.state_dict()}
    assert "backbone.layers.0.self_attn.q_norm.weight" not in backbone_keys
    assert not any(k.startswith("embedding.") for k in model.state_dict())


def test_greedy_alone_matches_hf(twins) -> None:
    hf, head, model = twins
    ids = torch.randint(0, 200, (13,), generator=torch.Generator().manual_seed(0)).tolist()
    runner = make_runner(model)
    runner.add_request("r", GREEDY)
    tokens = [runner.step([StepInput("r", ids, None)])[0].token]
    for _ in range(11):
        tokens.append(runner.step([StepInput("r", [tokens[-1]], None)])[0].token)
    assert tokens == hf_greedy(hf, head, ids, 12)


def test_greedy_mixed_batch_of_8_matches_hf(twins) -> None:
    hf, head, model = twins
    runner = make_runner(model)
    generator = torch.Generator().manual_seed(1)
    prompts = {
        f"r{i}": torch.randint(0, 200, (2 + 3 * i,), generator=generator).tolist()
        for i in range(8)
    }
    pending = {rid: list(ids) for rid, ids in prompts.items()}
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    for rid in prompts:
        runner.add_request(rid, GREEDY)
    while any(len(t) < 5 for t in tokens.values()):
        inputs = []
        for i, rid in enumerate(prompts):
            if pending[rid]:  # chunk size i + 1: from 1-row appends to whole prompts
                rows, pending[rid] = pending[rid][: i + 1], pending[rid][i + 1 :]
                inputs.append(StepInput(rid, rows, None, sample=not pending[rid]))
            elif len(tokens[rid]) < 5:
                inputs.append(StepInput(rid, [tokens[rid][-1]], None))
        for result in runner.step(inputs[::-1]):
            if result.token is not None:
                tokens[result.request_id].append(result.token)
    for rid, ids in prompts.items():
        assert tokens[rid] == hf_greedy(hf, head, ids, 5), rid


def test_custom_input_table_is_used_and_registered(twins) -> None:
    _, head, model = twins
    table = nn.Embedding(50, 64)
    talker_like = LlamaWithHead(model.backbone, head, embedding=table)
    ids = torch.tensor([3, 49])
    assert torch.equal(talker_like.embed_tokens(ids), table(ids))
    assert "embedding.weight" in talker_like.state_dict()


def test_config_defaults_head_dim_like_hf() -> None:
    config = LlamaBackboneConfig(**DIMS)
    assert config.resolved_head_dim == 16 and config.to_spec().has_qk_norm is False
    with pytest.raises(ValueError, match="LlamaBackboneConfig.head_dim"):
        LlamaBackboneConfig(**DIMS, head_dim=0)
