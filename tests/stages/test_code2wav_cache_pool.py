"""Code2Wav engine with the pooled DiT caches (`cache_pool_streams`): slot lifetimes.

Strategy: a two-slot pool on the tiny random vocoder; every way a request's state ends (last
chunk, STOP, a new epoch, a failed forward) must give its slot back, a reply beyond the pool
waits (no error, no busy stepping) until a stream ends and then decodes, and pooled audio
equals a dense engine's.
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


def test_a_reply_beyond_the_pool_waits_for_a_slot(engine: Code2WavEngine) -> None:
    for request_id in "abc":
        engine.submit(_request(request_id, 0))
    first = engine.step()
    assert sorted(r.request_id for r in first) == ["a", "b"] and all(r.error is None for r in first)
    assert engine.num_waiting_for_slot() == 1 and not engine.has_work()  # c waits; nothing to step
    engine.submit(_request("b", 1))
    assert engine.has_work() and [r.request_id for r in engine.step()] == ["b"]
    engine.submit(_request("a", 1, last=True))  # a's stream ends with this window
    assert [r.request_id for r in engine.step()] == ["a"]
    assert engine.has_work() and engine.num_waiting_for_slot() == 0
    results = engine.step()
    assert [(r.request_id, r.chunk_seq, r.error) for r in results] == [("c", 0, None)]
    assert results[0].audio.size > 0 and _free(engine) == 0


def test_a_stop_frees_a_slot_for_the_oldest_waiting_reply(engine: Code2WavEngine) -> None:
    for request_id in "abcd":
        engine.submit(_request(request_id, 0))
    engine.step()
    assert engine.num_waiting_for_slot() == 2
    engine.release("b")  # a STOP (barge-in, session end)
    assert [r.request_id for r in engine.step()] == ["c"]  # c came before d
    assert engine.num_waiting_for_slot() == 1 and engine.resource_counts()["codec_slot_waits"] == 1
    engine.release("d")  # a reply stopped while it waited holds nothing
    assert engine.num_waiting_for_slot() == 0 and not engine.has_work() and _free(engine) == 0


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


def test_the_profile_sets_the_pool_size() -> None:
    from backends.stages.factory import code2wav_pool_streams

    assert code2wav_pool_streams(5, max_sessions=8) == 5
    assert code2wav_pool_streams(0, max_sessions=8) == 16
