"""Building the Thinker on meta and materializing it: ThinkerModel.from_config and materialize.

Strategy: the real MiniCPM-o 4.5 dimensions are built on the meta device (no memory) and their
parameter count is checked against the count worked out from docs/model_facts.md#sizes; a shrunken
config with the real structure (Qwen3 with QK-norm and a 4:1 GQA ratio, Whisper with an ffn of 4 x
d_model, the real 80 mel bins and 1500 positions) is materialized on the CPU and checked tensor by
tensor against the init scheme and against an eagerly built model's buffers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.config import MiniCPMOConfig
from backends.checkpoint.tiny_config import tiny_config_dict
from backends.models.materialize import INIT_STD, materialize
from backends.models.qwen3 import Qwen3ForCausalLM
from backends.models.whisper_encoder import WhisperEncoderConfig, whisper_sinusoids
from backends.thinker.model import ThinkerModel, qwen3_config

REAL_LLM = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
            "vocab_size": 151936}
REAL_AUDIO = {"d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16,
              "encoder_ffn_dim": 4096, "num_mel_bins": 80, "max_source_positions": 1500}
SHRUNK_LLM = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384,
              "vocab_size": 1024}
SHRUNK_AUDIO = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4,
                "encoder_ffn_dim": 256, "num_mel_bins": 80, "max_source_positions": 1500}
# The sample std of n normal draws has a relative standard error of 1 / sqrt(2n); bfloat16
# rounding (2^-9 relative) is far below that for these sizes.
STD_SIGMAS = 5.0


def _config(llm: dict[str, Any], audio: dict[str, Any]) -> MiniCPMOConfig:
    raw = tiny_config_dict(vocab_size=llm["vocab_size"], audio_bos_token_id=1,
                           text_eos_token_id=2, eos_token_id=3, seed=0)
    raw.update(llm)
    raw["audio_config"].update(audio)
    raw["tts_config"]["llm_dim"] = llm["hidden_size"]
    return MiniCPMOConfig.from_dict(raw)


def _qwen3_params(c: dict[str, int]) -> int:
    h, d, layers = c["hidden_size"], c["head_dim"], c["num_hidden_layers"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    attention = h * q + 2 * h * kv + q * h + 2 * d  # q, k, v, o and the two QK norms
    per_layer = attention + 3 * h * c["intermediate_size"] + 2 * h
    return 2 * c["vocab_size"] * h + layers * per_layer + h  # untied head + final norm


def _whisper_params(c: dict[str, int], llm_hidden: int) -> int:
    d, ffn, mel = c["d_model"], c["encoder_ffn_dim"], c["num_mel_bins"]
    convs = mel * d * 3 + d + d * d * 3 + d
    per_layer = 4 * d * d + 3 * d + 2 * d * ffn + ffn + d + 4 * d  # k has no bias; 2 norms
    projector = (d * llm_hidden + llm_hidden) + (llm_hidden * llm_hidden + llm_hidden)
    layers = c["encoder_layers"] * per_layer + 2 * d  # and the final norm
    return convs + c["max_source_positions"] * d + layers + projector


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_real_dimensions_on_meta_cost_nothing_and_count_right() -> None:
    model = ThinkerModel.from_config(_config(REAL_LLM, REAL_AUDIO), "meta", torch.bfloat16)
    assert _count(model.llm) == _qwen3_params(REAL_LLM)
    assert 8.1e9 < _count(model.llm) < 8.3e9  # Qwen3-8B: ~8.2 B with the untied head
    assert _count(model.audio_encoder) == _whisper_params(REAL_AUDIO, REAL_LLM["hidden_size"])
    tensors = [*model.llm.parameters(), *model.audio_encoder.parameters()]
    assert {t.device.type for t in tensors} == {"meta"}
    assert {t.dtype for t in tensors} == {torch.bfloat16}


@pytest.fixture(scope="module")
def shrunk() -> ThinkerModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ThinkerModel.from_config(_config(SHRUNK_LLM, SHRUNK_AUDIO), "cpu", torch.bfloat16)


def test_shrunk_real_structure_is_materialized_with_the_init_scheme(shrunk: ThinkerModel) -> None:
    assert _count(shrunk.llm) == _qwen3_params(SHRUNK_LLM)
    for module in (shrunk.llm, shrunk.audio_encoder):
        for name, param in module.named_parameters():
            assert param.device.type == "cpu" and param.dtype == torch.bfloat16, name
            values = param.float()
            if name.endswith("embed_positions.weight"):
                expected = whisper_sinusoids(*param.shape).to(torch.bfloat16).float()
                torch.testing.assert_close(values, expected, rtol=0, atol=0)
            elif "norm" in name:
                assert torch.all(values == (1.0 if name.endswith("weight") else 0.0)), name
            elif name.endswith("bias"):
                assert torch.all(values == 0.0), name
            else:
                bound = STD_SIGMAS / (2 * values.numel()) ** 0.5
                assert abs(values.std().item() / INIT_STD - 1.0) < bound, name
    assert not shrunk.llm.training and not shrunk.audio_encoder.training


def test_buffers_equal_an_eager_build_in_float32(shrunk: ThinkerModel) -> None:
    """RoPE frequencies stay float32 in a bfloat16 model: a cast would round them."""
    eager = Qwen3ForCausalLM(qwen3_config(_config(SHRUNK_LLM, SHRUNK_AUDIO).llm))
    for (name, got), (_, want) in zip(shrunk.llm.named_buffers(), eager.named_buffers()):
        assert got.dtype == torch.float32, name
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    assert len(list(shrunk.llm.named_buffers())) == 1


def test_same_seed_same_weights_on_the_device_rng() -> None:
    config = _config(SHRUNK_LLM, SHRUNK_AUDIO)
    builds = []
    for _ in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            builds.append(ThinkerModel.from_config(config, torch.device("cpu"), torch.float32))
    first, second = (build.llm.state_dict() for build in builds)
    for name, tensor in first.items():
        torch.testing.assert_close(tensor, second[name], rtol=0, atol=0, msg=name)


def test_audio_tower_matches_the_eager_constructor_layout() -> None:
    """The meta-built tower has the eager tower's keys and shapes (what a checkpoint loads)."""
    encoder = WhisperEncoderConfig(**SHRUNK_AUDIO)
    eager = AudioEncoderModel.from_config(encoder, SHRUNK_LLM["hidden_size"])
    built = ThinkerModel.from_config(_config(SHRUNK_LLM, SHRUNK_AUDIO), "meta", torch.float32)
    shapes = {k: v.shape for k, v in built.audio_encoder.state_dict().items()}
    assert shapes == {k: v.shape for k, v in eager.state_dict().items()}


def test_unknown_module_types_are_refused() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(3, 3), Scale())
    with pytest.raises(TypeError, match=r"1 \(Scale\) has parameters or buffers"):
        materialize(module, "cpu", random_init=True)


def test_qwen2_configs_are_refused() -> None:
    config = _config({**SHRUNK_LLM, "attention_bias": True}, SHRUNK_AUDIO)
    with pytest.raises(ValueError, match="Qwen2 backbone"):
        ThinkerModel.from_config(config, "meta", torch.float32)
