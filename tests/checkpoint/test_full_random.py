"""backends/checkpoint/full_random.py: the real MiniCPM-o 4.5 dimensions with the tiny
tokenizer, checked on the meta device (structure and parameter counts, no memory) and with a
real (CPU) Talker draw at the checkpoint generator's scale."""
from __future__ import annotations

import pytest
import torch

from backends.checkpoint.full_random import full_random_checkpoint
from backends.thinker.model import ThinkerModel

# Published sizes: Qwen3-8B has 8.19e9 parameters with its untied LM head; Whisper-medium's
# encoder about 3.07e8. A few percent covers the projector and our module layout.
QWEN3_8B_PARAMS = 8.19e9
WHISPER_MEDIUM_ENCODER_PARAMS = 3.07e8
SIZE_TOLERANCE = 0.05
INIT_STD = 0.02
STD_TOLERANCE = 0.002  # over ~1e8 draws the sample std is within 1e-5; bf16 rounding dominates


@pytest.fixture(scope="module")
def ckpt():
    return full_random_checkpoint()


def test_config_has_the_real_dimensions(ckpt):
    llm, audio, tts = ckpt.config.llm, ckpt.config.audio, ckpt.config.tts
    assert (llm.hidden_size, llm.num_hidden_layers, llm.num_attention_heads, llm.num_key_value_heads,
            llm.head_dim, llm.intermediate_size, llm.vocab_size) == (4096, 36, 32, 8, 128, 12288, 151748)
    assert (audio.d_model, audio.encoder_layers, audio.encoder_attention_heads, audio.encoder_ffn_dim) == (
        1024, 24, 16, 4096)
    assert (tts.num_hidden_layers, tts.hidden_size, tts.num_attention_heads, tts.num_audio_tokens) == (
        20, 768, 12, 6562)
    assert tts.llm_dim == llm.hidden_size and tts.num_text_tokens == llm.vocab_size


def test_text_goes_through_the_tiny_tokenizer(ckpt):
    assert ckpt.tokenizer.vocab_size < ckpt.config.llm.vocab_size  # the engine masks the rest
    special = ckpt.special_tokens
    assert ckpt.tokenizer.id_to_token(special.speak) == "<|speak|>"
    assert ckpt.tokenizer.decode(ckpt.tokenizer.encode("hello there")) == "hello there"
    assert ckpt.tokenizer.id_to_token(ckpt.config.tts.audio_bos_token_id) == "<|audio_bos|>"


def test_thinker_structure_on_meta(ckpt):
    model = ThinkerModel.from_full_random(ckpt, torch.device("meta"), torch.bfloat16)
    llm_params = sum(p.numel() for p in model.llm.parameters())
    audio_params = sum(p.numel() for p in model.audio_encoder.parameters())
    assert llm_params == pytest.approx(QWEN3_8B_PARAMS, rel=SIZE_TOLERANCE)
    projector_params = 1024 * 4096 + 4096 * 4096  # Linear(ffn // 4 -> hidden), Linear(hidden -> hidden)
    assert audio_params == pytest.approx(WHISPER_MEDIUM_ENCODER_PARAMS + projector_params, rel=SIZE_TOLERANCE)
    assert next(model.llm.parameters()).dtype == torch.bfloat16


def test_talker_is_drawn_at_the_checkpoint_scale(ckpt):
    model = ckpt.build_talker(torch.device("cpu"), torch.bfloat16)
    assert model.emb_text.weight.shape == (151748, 768)
    assert model.emb_text.weight.dtype == torch.bfloat16
    assert float(model.emb_text.weight.detach().float().std()) == pytest.approx(INIT_STD, abs=STD_TOLERANCE)
    assert model.rotary.inv_freq.dtype == torch.float32  # RoPE tables stay float32 under bf16
    again = ckpt.build_talker(torch.device("cpu"), torch.bfloat16)
    assert torch.equal(model.head_code[0].weight, again.head_code[0].weight)  # seeded
