"""The Talker model: checkpoint names, weight-norm folding, conditioning math, runner forward.

Strategy: build the `tts.*` tensors the way the checkpoint holds them (a transformers
`LlamaModel` backbone, a torch weight-normalised head) and load them with
`load_talker_weights`; then check (a) the folded head equals torch's weight_norm, (b)
`condition_embeds` against the formula written out by hand, and (c) a prefill + decode through
the real `ModelRunner` against transformers' LlamaModel on the same input embeddings, with the
chunk policy giving exactly 25 frames for a mid-turn condition.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from backends.models.talker import (
    TalkerConfig,
    TalkerModel,
    condition_order,
    load_talker_weights,
)
from backends.models.talker_policy import CODEC_EOS, ChunkKind, TalkerChunkPolicy
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig, SamplingParams, StepInput

CONFIG = TalkerConfig(
    llm_dim=24, hidden_size=32, intermediate_size=64, num_attention_heads=4,
    num_key_value_heads=2, num_hidden_layers=2, num_text_tokens=50, audio_bos_token_id=47,
    text_eos_token_id=48, backbone_vocab_size=16,
)
# float32 forward of the same weights through a different attention path (paged vs HF eager)
FORWARD_ATOL = 1e-4
FOLD_ATOL = 1e-6  # same norm recomputed in float32
RUNNER = RunnerConfig(num_blocks=32, max_num_reqs=2, max_model_len=64, block_size=4)


def _reference_talker(config: TalkerConfig) -> nn.Module:
    """A module whose state dict has the checkpoint's `tts.*` layout (after the prefix)."""
    torch.manual_seed(7)
    talker = nn.Module()
    talker.model = transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size, vocab_size=config.backbone_vocab_size,
        rms_norm_eps=config.rms_norm_eps, rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings, initializer_range=0.2,
    )).eval()
    talker.emb_text = nn.Embedding(config.num_text_tokens, config.hidden_size)
    talker.emb_code = nn.ModuleList([nn.Embedding(config.num_audio_tokens, config.hidden_size)])
    talker.projector_semantic = nn.Module()
    talker.projector_semantic.linear1 = nn.Linear(config.llm_dim, config.hidden_size)
    talker.projector_semantic.linear2 = nn.Linear(config.hidden_size, config.hidden_size)
    head = nn.Linear(config.hidden_size, config.num_audio_tokens, bias=False)
    talker.head_code = nn.ModuleList([weight_norm(head, dim=0)])
    with torch.no_grad():  # g != ||v||: a fold that ignores g must fail
        head.parametrizations.weight.original0.uniform_(0.5, 2.0)
    return talker


@pytest.fixture(scope="module")
def reference() -> nn.Module:
    return _reference_talker(CONFIG)


@pytest.fixture(scope="module")
def talker(reference: nn.Module) -> TalkerModel:
    model = TalkerModel(CONFIG).eval()
    state = {f"tts.{k}": v for k, v in reference.state_dict().items()}
    assert load_talker_weights(model, state) == []
    return model


def test_parameter_names_match_the_checkpoint(reference: nn.Module) -> None:
    ours = set(TalkerModel(CONFIG).state_dict())
    theirs = {k.replace(".parametrizations.weight.original0", ".weight")
              for k in reference.state_dict() if not k.endswith("original1")}
    assert ours == theirs


def test_head_is_folded_like_torch_weight_norm(reference: nn.Module, talker: TalkerModel) -> None:
    expected = reference.head_code[0].weight.detach()  # torch recomputes g * v / ||v||
    torch.testing.assert_close(talker.head_code[0].weight.detach(), expected, atol=FOLD_ATOL, rtol=0)


def test_bf16_head_is_folded_in_float32(reference: nn.Module) -> None:
    """bf16 shards: W = g * v / ||v|| from the upcast g and v, not rounded to bf16 again (a
    float32 server would otherwise serve logits ~1e-2 off the official float32 ones)."""
    state = {k: v.to(torch.bfloat16) for k, v in reference.state_dict().items()}
    model = TalkerModel(CONFIG)
    load_talker_weights(model, state)
    g = state["head_code.0.parametrizations.weight.original0"].float()
    v = state["head_code.0.parametrizations.weight.original1"].float()
    expected = g * v / v.norm(dim=1, keepdim=True)
    torch.testing.assert_close(model.head_code[0].weight.detach(), expected, atol=FOLD_ATOL, rtol=0)
    assert (expected.bfloat16().float() - expected).abs().max() > FOLD_ATOL  # rounding would show


def test_missing_keys_are_named(reference: nn.Module) -> None:
    state = {f"tts.{k}": v for k, v in reference.state_dict().items() if "emb_code" not in k}
    with pytest.raises(ValueError, match=r"emb_code\.0\.weight"):
        load_talker_weights(TalkerModel(CONFIG), state)


def test_unused_keys_are_returned(reference: nn.Module) -> None:
    state = {**reference.state_dict(), "extra.weight": torch.zeros(1)}
    assert load_talker_weights(TalkerModel(CONFIG), state) == ["extra.weight"]


def test_condition_embeds_math(reference: nn.Module) -> None:
    """The projected hidden is always L2-normalised, as the official duplex path does."""
    model = TalkerModel(CONFIG)
    load_talker_weights(model, reference.state_dict())
    ids = torch.tensor([3, 9, 9, 41])
    hidden = torch.randn(4, CONFIG.llm_dim)
    with torch.no_grad():
        got = model.condition_embeds(ids, hidden)
        proj = reference.projector_semantic
        projected = proj.linear2(torch.relu(proj.linear1(hidden)))
        projected = projected / projected.norm(dim=-1, keepdim=True)
        rows = reference.emb_text(ids) + projected
        bos = reference.emb_text.weight[CONFIG.audio_bos_token_id]
    assert got.shape == (5, CONFIG.hidden_size)
    torch.testing.assert_close(got[:4], rows, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[4], bos, atol=0, rtol=0)


def test_condition_embeds_many_equals_one_by_one(talker: TalkerModel) -> None:
    """Three conditions (1, 4 and 2 tokens) projected in one pass give each condition's own
    rows, its audio_bos row last."""
    counts = [1, 4, 2]
    ids = [torch.randint(0, CONFIG.num_text_tokens, (n,)) for n in counts]
    hidden = [torch.randn(n, CONFIG.llm_dim) for n in counts]
    assert condition_order(counts).tolist() == [0, 7, 1, 2, 3, 4, 7, 5, 6, 7]
    with torch.no_grad():
        many = talker.condition_embeds_many(torch.cat(ids), torch.cat(hidden), counts)
        for got, one_ids, one_hidden in zip(many, ids, hidden, strict=True):
            torch.testing.assert_close(got, talker.condition_embeds(one_ids, one_hidden))


def test_condition_embeds_rejects_bad_shapes(talker: TalkerModel) -> None:
    with pytest.raises(ValueError, match="hidden"):
        talker.condition_embeds(torch.tensor([1, 2]), torch.zeros(3, CONFIG.llm_dim))


def test_decoder_protocol_tables(reference: nn.Module, talker: TalkerModel) -> None:
    codes = torch.tensor([0, 6560, CODEC_EOS])
    with torch.no_grad():
        torch.testing.assert_close(talker.embed_tokens(codes), reference.emb_code[0](codes))
        hidden = torch.randn(2, CONFIG.hidden_size)
        logits = talker.compute_logits(hidden)
        expected = hidden @ reference.head_code[0].weight.T
    assert logits.dtype == torch.float32 and logits.shape == (2, CONFIG.num_audio_tokens)
    torch.testing.assert_close(logits, expected, atol=FOLD_ATOL, rtol=1e-5)


def test_runner_forward_matches_transformers(reference: nn.Module, talker: TalkerModel) -> None:
    """Prefill of condition rows + one decode of a code row, against HF LlamaModel."""
    runner = ModelRunner(talker, RUNNER)
    runner.add_request("r", SamplingParams())
    with torch.no_grad():
        cond = talker.condition_embeds(torch.tensor([1, 2, 3]), torch.randn(3, CONFIG.llm_dim))
        first = runner.step([StepInput("r", [0] * 4, cond, capture_hidden=True)])[0]
        second = runner.step([StepInput("r", [first.token], capture_hidden=True)])[0]
        code_row = reference.emb_code[0](torch.tensor([first.token]))
        embeds = torch.cat([cond, code_row])[None]
        expected = reference.model(inputs_embeds=embeds).last_hidden_state[0]
    got = torch.cat([first.hidden, second.hidden])
    torch.testing.assert_close(got, expected, atol=FORWARD_ATOL, rtol=0)
    assert first.token == int(talker.compute_logits(expected[3:4]).argmax())


def test_mid_turn_chunk_through_the_runner_is_25_frames(talker: TalkerModel) -> None:
    """Edge case 5 end to end: condition prefill, decode until EOS, 25 frames forwarded."""
    policy = TalkerChunkPolicy()
    runner = ModelRunner(talker, RUNNER)
    runner.add_request("r", policy.sampling.to_sampling_params(), policy)
    policy.begin_chunk(ChunkKind.MID_TURN)
    with torch.no_grad():
        cond = talker.condition_embeds(torch.tensor([5]), torch.randn(1, CONFIG.llm_dim))
        token = runner.step([StepInput("r", [0, 0], cond)])[0].token
        frames = []
        while token != CODEC_EOS:
            frames.append(token)
            token = runner.step([StepInput("r", [token])])[0].token
    assert len(frames) == 25 and all(0 <= f < CODEC_EOS for f in frames)


def test_config_validation_and_from_dict() -> None:
    with pytest.raises(ValueError, match="num_vq"):
        TalkerConfig(num_vq=2)
    with pytest.raises(ValueError, match="audio_bos_token_id"):
        TalkerConfig(num_text_tokens=100)
    parsed = TalkerConfig.from_dict({**_fields(CONFIG), "attention_type": "full_attention"})
    assert parsed == CONFIG and parsed.eos_id == 6561


def _fields(config: TalkerConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}
