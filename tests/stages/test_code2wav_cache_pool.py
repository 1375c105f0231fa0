"""Code2Wav engine with the pooled DiT caches (`cache_pool_streams`): slot lifetimes.

Strategy: a two-slot pool on the tiny random vocoder; every way a request's state ends (last
chunk, STOP, a new epoch, a failed forward) must give its slot back, a request beyond the pool
gets an internal error while the others go on, and pooled audio equals a dense engine's.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.contracts.messages import ACTION_STOP, Code2WavRequest
from backends.models.token2wav import Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.stages.code2wav_engine import ERROR_INTERNAL, Code2WavEngine


def _model() -> Token2Wav:
    return random_token2wav(Token2WavConfig.tiny(), seed=0)


def _voice(model: Token2Wav) -> Voice:
    return model.prepare_voice(random_voice_prompt(0))


@pytest.fixture
def engine() -> Code2WavEngine:
    model = _model()
    return Code2WavEngine(model, _voice(model), cache_pool_streams=2)


def _request(request_id: str, chunk_seq: int, epoch: int = 0, last: bool = False) -> Code2WavRequest:
    codes = np.random.default_rng(chunk_seq).integers(0, 6561, 28).astype(np.int32)
    return Code2WavRequest(request_id, epoch, chunk_seq, codes, 3, last)


def _free(engine: Code2WavEngine) -> int:
    return engine.token2wav.cache_pool.num_free()


def test_last_chunk_stop_and_new_epoch_free_slots(engine: Code2WavEngine) -> None:
    engine.submit(_request("a", 0))
    engine.submit(_request("b", 0))
    engine.step()
    assert _free(engine) == 0
    engine.submit(_request("a", 1, last=True))
    engine.step()
    assert _free(engine) == 1  # a finished
    engine.submit(Code2WavRequest("b", 0, 0, np.zeros(0, np.int32), action=ACTION_STOP))
    assert _free(engine) == 2  # b stopped
    engine.submit(_request("c", 0))
    engine.step()
    engine.submit(_request("c", 0, epoch=1))  # a new epoch replaces c's stream
    assert engine.step()[0].error is None
    assert _free(engine) == 1 and engine.num_states() == 1


def test_a_request_beyond_the_pool_fails_alone(engine: Code2WavEngine) -> None:
    for request_id in "abc":
        engine.submit(_request(request_id, 0))
    results = {r.request_id: r for r in engine.step()}
    assert results["a"].error is None and results["b"].error is None
    assert results["c"].error.startswith(f"{ERROR_INTERNAL}: CachePoolFullError")
    engine.submit(_request("a", 1, last=True))
    engine.step()
    engine.submit(_request("c", 0))  # a's slot is free again
    assert engine.step()[0].error is None


def test_a_failed_forward_frees_every_slot(engine: Code2WavEngine,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engine.submit(_request("a", 0))
    engine.submit(_request("b", 0))
    engine.step()

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.token2wav.flow.decoder, "solve_pooled", broken)
    engine.submit(_request("a", 1))
    engine.submit(_request("b", 1))
    assert all(r.error.startswith(ERROR_INTERNAL) for r in engine.step())
    assert _free(engine) == 2 and engine.num_states() == 0


def test_pooled_engine_audio_equals_dense_engine(engine: Code2WavEngine) -> None:
    model = _model()
    dense = Code2WavEngine(model, _voice(model))
    outputs = []
    for runner in (engine, dense):
        for chunk_seq in range(4):
            for request_id in "ab":
                runner.submit(_request(request_id, chunk_seq, last=chunk_seq == 3))
        audio = []
        while runner.num_pending():
            audio += [r.audio for r in runner.step()]
        outputs.append(audio)
    assert all(np.array_equal(a, b) for a, b in zip(*outputs))
    assert _free(engine) == 2


def test_the_served_engine_pools_two_streams_per_session() -> None:
    """The stage factory turns the pool on (the `cpu` profile too): two slots per session, so
    an epoch's stream that has not yet seen its STOP leaves room for the next epoch's."""
    from backends.stages.factory import build_code2wav_engine

    service = build_code2wav_engine({"checkpoint": "tiny", "max_sessions": "3"})
    pool = service.engine.token2wav.cache_pool
    assert pool is not None and pool.max_streams == 6
