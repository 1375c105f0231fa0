"""ThinkerEngine with the real streaming encoder: the one-unit appends of the sessions that
activate in one step are encoded in one batch (backends/thinker/unit_batch.py).

Strategy: three sessions on one engine (their appends batched, a two-unit append and a lone
activation taking the serial path) against each session alone on its own engine (always
serial: one session never forms a batch). Tokens must be equal and hidden rows equal within
float32 noise; a position table of 200 restarts the encoder caches within the run. A session
whose mel step fails inside a batch ends alone with an `internal` error.
"""

from __future__ import annotations

import numpy as np
import pytest
from thinker_driving import UNIT, Parts, audio_engine, run_idle, serve, tiny_audio_parts

from backends.contracts.messages import ThinkerRequest
from backends.contracts.sink import ListSink
from backends.stages.thinker_engine import ThinkerEngine
from backends.thinker import unit_batch

HIDDEN_ATOL = 1e-4  # as tests/stages/test_thinker_engine.py: mixed-batch float32 noise


@pytest.fixture(scope="module")
def parts() -> Parts:
    return tiny_audio_parts()


def _session(request_id: str, seed: int, units: list[int]) -> list[ThinkerRequest]:
    rng = np.random.default_rng(seed)
    audios = [(0.1 * rng.standard_normal(n * UNIT)).astype(np.float32) for n in units]
    return [ThinkerRequest(request_id, a, seq=i, seed=seed) for i, a in enumerate(audios)]


SESSIONS = {  # request id -> (first round, its appends)
    "a": (0, _session("a", 1, [1, 1, 1, 1, 1, 1, 1])),
    "b": (2, _session("b", 2, [1, 1, 1, 1, 1])),
    "c": (3, _session("c", 3, [1, 2, 1, 1])),  # the two-unit append takes the serial path
}


def _play(engine: ThinkerEngine, sessions: dict) -> dict[str, list[ListSink]]:
    """Round r submits append r - start of every started session, then runs the engine idle:
    the sessions of a round activate in the same step, at different stream ages."""
    sinks: dict[str, list[ListSink]] = {rid: [] for rid in sessions}
    rounds = max(start + len(requests) for start, requests in sessions.values())
    for round_ in range(rounds):
        for rid, (start, requests) in sessions.items():
            if 0 <= round_ - start < len(requests):
                sinks[rid] += serve(engine, [requests[round_ - start]])
        run_idle(engine)
    return sinks


def _alone(parts, rid: str) -> list:
    sinks = _play(audio_engine(parts), {rid: SESSIONS[rid]})[rid]
    assert all(s.closed and s.error is None and len(s.results) == 1 for s in sinks)
    return [s.results[0] for s in sinks]


def _assert_same(sinks: list[ListSink], want: list) -> None:
    assert all(s.closed and s.error is None and len(s.results) == 1 for s in sinks)
    for sink, expected in zip(sinks, want):
        got = sink.results[0]
        assert (got.decision, got.unit_index) == (expected.decision, expected.unit_index)
        np.testing.assert_array_equal(got.token_ids, expected.token_ids)
        np.testing.assert_allclose(got.tts_hidden, expected.tts_hidden, rtol=0, atol=HIDDEN_ATOL)


def _spy_batches(monkeypatch) -> list[list[int]]:
    """The cache lengths of the sessions of every batched encode."""
    batches: list[list[int]] = []
    real = unit_batch.encode_units_batched

    def spy(encoders, units):
        batches.append([encoder.cache_length for encoder in encoders])
        return real(encoders, units)

    monkeypatch.setattr(unit_batch, "encode_units_batched", spy)
    return batches


def test_batched_sessions_equal_sessions_alone(parts, monkeypatch) -> None:
    want = {rid: _alone(parts, rid) for rid in SESSIONS}
    batches = _spy_batches(monkeypatch)
    sinks = _play(audio_engine(parts), SESSIONS)
    for rid in SESSIONS:
        _assert_same(sinks[rid], want[rid])
    # cache lengths before each batch (rounds 2-6; c's two-unit round 4 is serial): a batch
    # with a restart (150 + 52 >= 200) and a first unit next to a mid-stream unit
    assert batches == [[100, 0], [150, 50, 0], [50, 100], [100, 150, 150], [150, 50, 50]]


def test_a_failing_session_in_a_batch_ends_alone(parts, monkeypatch) -> None:
    want = {rid: _alone(parts, rid) for rid in ("a", "c")}
    batches = _spy_batches(monkeypatch)
    engine = audio_engine(parts)
    real_submit = engine.submit

    def submit(request: ThinkerRequest, sink: ListSink) -> None:
        real_submit(request, sink)
        if request.request_id == "b" and request.seq == 1:  # its second unit fails to encode
            engine._sessions["b"].encoder.take_unit = _broken  # type: ignore[method-assign]

    engine.submit = submit  # type: ignore[method-assign]
    sinks = _play(engine, SESSIONS)
    assert [len(lengths) for lengths in batches[:2]] == [2, 3]
    first, second, *later = sinks["b"]
    assert first.error is None and len(first.results) == 1
    assert second.error.code == "internal" and "injected mel failure" in second.error.message
    assert all(s.error.code == "invalid_argument" for s in later)  # b is gone: unknown request
    assert "b" not in engine.runner.states.req_id_to_slot
    for rid in ("a", "c"):
        _assert_same(sinks[rid], want[rid])


def _broken(samples: np.ndarray):
    raise RuntimeError("injected mel failure")
