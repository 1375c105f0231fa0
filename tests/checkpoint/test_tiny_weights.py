"""Tests for backends/checkpoint/tiny_weights.py.

Strategy: the state dict must carry the real prefixes and shapes, depend only on the seed,
and give a random Thinker that still produces varied greedy tokens (a collapsed init would
make every duplex test see the same token).
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from backends.checkpoint.config import MiniCPMOConfig
from backends.checkpoint.tiny_config import tiny_config_dict
from backends.checkpoint.tiny_weights import INIT_STD, tiny_state_dict

STD_TOLERANCE = 0.2  # relative; thousands of samples per matrix keep the estimate within ~5 %
MIN_DISTINCT_GREEDY = 100  # of 900 single-token inputs; measured ~470 at seed 0


def _config() -> MiniCPMOConfig:
    return MiniCPMOConfig.from_dict(tiny_config_dict(vocab_size=1000, audio_bos_token_id=998,
                                                     text_eos_token_id=999, eos_token_id=978, seed=0))


def test_prefixes_and_seed_dependence() -> None:
    config = _config()
    state = tiny_state_dict(config, seed=0)
    prefixes = {k.split(".")[0] for k in state}
    assert prefixes == {"llm", "apm", "audio_projection_layer", "tts"}
    assert all(v.dtype == torch.float32 for v in state.values())
    again, other = tiny_state_dict(config, seed=0), tiny_state_dict(config, seed=1)
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert not torch.equal(state["tts.emb_code.0.weight"], other["tts.emb_code.0.weight"])


def test_init_scale_and_weight_norm_halves() -> None:
    state = tiny_state_dict(_config(), seed=0)
    for key in ("llm.model.embed_tokens.weight", "tts.emb_text.weight", "tts.emb_code.0.weight",
                "audio_projection_layer.linear1.weight"):
        std = state[key].std().item()
        assert abs(std - INIT_STD) < STD_TOLERANCE * INIT_STD, f"{key}: std {std:.4f}"
    g = state["tts.head_code.0.parametrizations.weight.original0"]
    v = state["tts.head_code.0.parametrizations.weight.original1"]
    assert torch.allclose(g, v.norm(dim=1, keepdim=True))  # the weight-norm init: W = v


def test_random_thinker_gives_varied_tokens() -> None:
    config = _config()
    llm = config.llm
    model = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=llm.hidden_size, num_hidden_layers=llm.num_hidden_layers,
        num_attention_heads=llm.num_attention_heads, num_key_value_heads=llm.num_key_value_heads,
        head_dim=llm.head_dim, intermediate_size=llm.intermediate_size, vocab_size=llm.vocab_size,
        tie_word_embeddings=False,
    ))
    state = tiny_state_dict(config, seed=0)
    model.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("llm.")})
    with torch.no_grad():
        logits = model(torch.arange(900).view(900, 1)).logits[:, -1]
    distinct = len(set(logits.argmax(-1).tolist()))
    assert distinct >= MIN_DISTINCT_GREEDY, f"only {distinct} distinct greedy tokens"
