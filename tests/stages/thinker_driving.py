"""What the Thinker engine tests with the real streaming encoder share: the tiny parts (a tiny
random Qwen3, a tiny Whisper tower, the tiny checkpoint's tokenizer), an engine over them,
serving requests, and running the engine until it has no work."""

from __future__ import annotations

import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.contracts.messages import ThinkerRequest
from backends.contracts.sink import ListSink
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.models.whisper_encoder import WhisperEncoderConfig
from backends.runner.types import RunnerConfig
from backends.stages.thinker_engine import ThinkerEngine

HIDDEN = 32
UNIT = 16000
MAX_STEPS = 2000

Parts = tuple[Qwen3ForCausalLM, AudioEncoderModel, TextTokenizer, SpecialTokens]


def tiny_audio_parts(num_layers: int = 2, num_heads: int = 4) -> Parts:
    """Seeded, without touching the global RNG; a position table of 200 encoder frames, so
    a few units restart the encoder caches. num_layers, num_heads: the Qwen3's decoder layers
    and query heads (over half as many kv heads); Triton's interpreter runs a set of kernel
    launches per layer and programs per head and token."""
    tokenizer = TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        llm = Qwen3ForCausalLM(Qwen3Config(
            hidden_size=HIDDEN, num_hidden_layers=num_layers, num_attention_heads=num_heads,
            num_key_value_heads=num_heads // 2, head_dim=8, intermediate_size=64, vocab_size=1024,
        )).eval()
        whisper = WhisperEncoderConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                       encoder_ffn_dim=128, max_source_positions=200)
        audio = AudioEncoderModel.from_config(whisper, HIDDEN)
    return llm, audio, tokenizer, SpecialTokens.resolve(tokenizer)


def audio_engine(parts: Parts, **runner_overrides: object) -> ThinkerEngine:
    llm, audio, tokenizer, special = parts
    settings: dict[str, object] = dict(num_blocks=128, max_num_reqs=4, max_model_len=512)
    runner = RunnerConfig(**{**settings, **runner_overrides})  # type: ignore[arg-type]
    return ThinkerEngine(llm, audio, tokenizer, special, runner)


def serve(engine: ThinkerEngine, requests: list[ThinkerRequest]) -> list[ListSink]:
    sinks = [ListSink() for _ in requests]
    for request, sink in zip(requests, sinks):
        engine.submit(request, sink)
    return sinks


def run_idle(engine: ThinkerEngine) -> None:
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("engine did not go idle")
