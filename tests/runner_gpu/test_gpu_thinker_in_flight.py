"""On a GPU, the appends the Thinker engine lays out while a step is in flight (mel, graphed
encoder, rows) never make the host wait for the GPU: otherwise they would only move the wait.

Strategy: a tiny Qwen3 and the real streaming encoder on CUDA (fast path, encoder graphs). A
replying session decodes; at one of its steps a scripted drain submits units for two idle
sessions and turns torch's sync debug mode to "error" until the step's results are read, so
any sync in their layout ends them with an error. Their units must match the same sessions
served alone. Skipped without CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from backends.audio.encoder_model import AudioEncoderModel  # noqa: E402
from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer  # noqa: E402
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer  # noqa: E402
from backends.contracts.messages import ThinkerRequest  # noqa: E402
from backends.contracts.sink import ListSink  # noqa: E402
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from backends.models.whisper_encoder import WhisperEncoderConfig  # noqa: E402
from backends.runner.types import RunnerConfig  # noqa: E402
from backends.stages.thinker_engine import ThinkerEngine  # noqa: E402

HIDDEN = 128
UNIT = 16000


@pytest.fixture(scope="module")
def parts():
    tokenizer = TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)
    torch.manual_seed(7)
    llm = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, intermediate_size=256, vocab_size=1024)).eval().to("cuda")
    whisper = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                   encoder_ffn_dim=256, max_source_positions=1500)
    audio = AudioEncoderModel.from_config(whisper, HIDDEN, device="cuda")
    return llm, audio, tokenizer, SpecialTokens.resolve(tokenizer)


def _engine(parts) -> ThinkerEngine:
    llm, audio, tokenizer, special = parts
    runner = RunnerConfig(num_blocks=8 * 32, max_num_reqs=8, max_model_len=512, device="cuda",
                          dtype=torch.float32, attention_backend="triton")
    return ThinkerEngine(llm, audio, tokenizer, special, runner)


def _units(rid: str, seed: int, count: int, **first) -> list[ThinkerRequest]:
    rng = np.random.default_rng(seed)
    audio = [(0.1 * rng.standard_normal(UNIT)).astype(np.float32) for _ in range(count)]
    return [ThinkerRequest(rid, a, seq=k, seed=seed, **(first if k == 0 else {}))
            for k, a in enumerate(audio)]


REPLY = dict(initial_user_text="tell me about the sea", reply_units=2, reply_tokens_per_unit=3)


def _run(engine: ThinkerEngine) -> None:
    for _ in range(500):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("engine did not go idle")


def _serve(engine: ThinkerEngine, requests: list[ThinkerRequest]) -> list[ListSink]:
    sinks = [ListSink() for _ in requests]
    for request, sink in zip(requests, sinks):
        engine.submit(request, sink)
    return sinks


def test_appends_laid_out_in_flight_never_sync(parts, monkeypatch) -> None:
    replier = _units("r", 1, 1, **REPLY)
    idle = {rid: _units(rid, seed, 2) for rid, seed in (("a", 2), ("b", 3))}
    want = {}
    for rid, requests in idle.items():
        alone = _engine(parts)
        sinks = _serve(alone, requests)
        _run(alone)
        want[rid] = [s.results[0] for s in sinks]
    engine = _engine(parts)
    first = {rid: _serve(engine, requests[:1]) for rid, requests in idle.items()}
    _run(engine)  # their first units (and the encoder graphs) before the checked step
    late: dict[str, list[ListSink]] = {}

    def drain() -> None:
        if late:
            return
        late.update({rid: _serve(engine, requests[1:]) for rid, requests in idle.items()})
        torch.cuda.set_sync_debug_mode("error")

    engine.attach_in_flight_drain(drain)
    launch = engine.runner.launch_step

    def launch_checked(inputs):
        pending = launch(inputs)
        wait = pending.wait

        def wait_unchecked():
            torch.cuda.set_sync_debug_mode(0)
            return wait()

        pending.wait = wait_unchecked
        return pending

    monkeypatch.setattr(engine.runner, "launch_step", launch_checked)
    reply = _serve(engine, replier)
    try:
        engine.step()  # the reply's prefill; the drain posts the units
        assert late and all(engine._sessions[rid].active is not None for rid in idle)
        _run(engine)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert reply[0].error is None and reply[0].results
    for rid in idle:
        sinks = first[rid] + late[rid]
        assert all(s.closed and s.error is None for s in sinks), [s.error for s in sinks]
        got = [s.results[0] for s in sinks]
        for a, b in zip(got, want[rid]):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            np.testing.assert_allclose(a.tts_hidden, b.tts_hidden, rtol=0, atol=1e-4)
