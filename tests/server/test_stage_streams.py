"""The orchestrator's stage streams on a real server (backends/serving/grpc_stages.py): a
session's stage calls leave their streams open for the next call, streams nobody uses close
after the idle time, so an idle server holds none (what the leak tests' baselines rely on), and
calls abandoned before their FINAL are drained, never cancelled (backends/serving/stage_channel.py).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from server_resources import ServerResources, settled, wait_for_gauges
from session_probe import silence_units
from stage_calls import StageEndpoint, call, stop

from backends.audio.codec_windows import CodecWindowBridge
from backends.checkpoint.tiny_config import TINY_HIDDEN
from backends.contracts.messages import (
    ACTION_EXPECT, Code2WavAudio, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, expect_request,
)
from backends.contracts.stage_clients import StageCallError
from backends.serving.grpc_stages import DEFAULT_STREAM_IDLE_S, GrpcStageClients
from backends.stages.code2wav_engine import request_from_window

IDLE_STREAMS = ("stage_idle_streams", "duplex")
REPLY = {"initial_user_text": "Hello.", "reply_units": 1, "reply_tokens_per_unit": 2}
SEEN_WITHIN_S = 10.0


def _wait_for_open_streams(server, timeout_s: float) -> float:
    """The most idle streams seen by the time one shows up (or the timeout)."""
    deadline, most = time.monotonic() + timeout_s, 0.0
    while most < 1.0 and time.monotonic() < deadline:
        most = max(most, ServerResources.take(server).gauges.get(IDLE_STREAMS, 0.0))
        time.sleep(0.1)
    return most


def test_calls_leave_streams_open_and_idle_ones_close(reliability_server, probes):
    probe = probes()
    probe.start(**REPLY)
    probe.append(silence_units(3))
    probe.wait_type("response.done")
    probe.append(silence_units(1))  # one more Thinker call while the session listens
    assert _wait_for_open_streams(reliability_server, SEEN_WITHIN_S) >= 1.0, "no stage stream stayed open"
    probe.close()
    # closed within the idle time, the closer's period and a gauge publication (0.5 s)
    closed = wait_for_gauges(reliability_server, {IDLE_STREAMS: 0.0}, timeout_s=DEFAULT_STREAM_IDLE_S + 30.0)
    assert closed == {IDLE_STREAMS: 0.0}


def test_each_stage_sends_its_last_result_on_the_final(reliability_server, baseline):
    """A Thinker unit, a Talker chunk and a Code2Wav window each end with one response that
    carries the last result and the FINAL flag, not a data response and then an empty FINAL:
    the orchestrator plays a window's audio once its call has ended, so a separate FINAL would
    add a message round to every reply's first audio."""
    stages = StageEndpoint.of(reliability_server)
    hidden = np.random.default_rng(0).standard_normal((4, TINY_HIDDEN)).astype(np.float32)
    window = CodecWindowBridge().push(np.random.default_rng(1).integers(0, 6561, 25).tolist())[0]
    try:
        answers = {
            "thinker": call(stages, "thinker", ThinkerRequest(
                request_id="fin-t.e0", audio=np.zeros(16000, np.float32), seq=0, initial_user_text="Hello.",
                reply_units=1, reply_tokens_per_unit=2), ThinkerUnitResult),
            "talker": call(stages, "talker", TalkerRequest(
                request_id="fin-k.e0", condition_seq=0, token_ids=np.arange(5, 9, dtype=np.int32), hidden=hidden,
                turn_start=True, turn_end=True, seed=1), TalkerCodes),
            "code2wav": call(stages, "code2wav", request_from_window("fin-c.e0", window), Code2WavAudio),
        }
    finally:
        for model, request_id in (("thinker", "fin-t.e0"), ("talker", "fin-k.e0"), ("code2wav", "fin-c.e0")):
            stop(stages, model, request_id)
    for model, answer in answers.items():
        assert answer.error is None and answer.results, (model, answer)
        assert answer.final_carried_result, (model, answer.responses)
        assert answer.responses == len(answer.results), (model, answer.responses)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


def test_code2wav_answers_an_expect_at_once_and_then_decodes_the_announced_window(reliability_server, baseline):
    """The orchestrator's announcement of a reply's first window (`expect`): Code2Wav answers it
    with one empty FINAL and decodes the window when it comes; the Talker, which takes no
    announcements, refuses one as invalid input and goes on serving."""
    stages = StageEndpoint.of(reliability_server)
    window = CodecWindowBridge().push(np.random.default_rng(2).integers(0, 6561, 25).tolist())[0]
    hidden = np.zeros((1, TINY_HIDDEN), np.float32)
    try:
        announced = call(stages, "code2wav", expect_request("exp-c.e0"))
        assert announced.error is None and announced.responses == 1 and not announced.final_carried_result
        audio = call(stages, "code2wav", request_from_window("exp-c.e0", window), Code2WavAudio)
        assert audio.error is None and audio.results and audio.results[0].audio.size > 0
        refused = call(stages, "talker", TalkerRequest(
            request_id="exp-k.e0", condition_seq=0, token_ids=np.arange(5, 6, dtype=np.int32), hidden=hidden,
            action=ACTION_EXPECT))
        assert refused.error is not None and "ACTION must be one of" in refused.error, refused
    finally:
        stop(stages, "code2wav", "exp-c.e0")
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


WORKERS = 3  # below the reliability profile's 6 requests per stage: admission never refuses one
ABANDONED_PER_WORKER = 12


@pytest.fixture
def live_cancels(monkeypatch):
    """Cancellations of live gRPC streams in this process: each one is a request the server
    sees cancelled while it may be completing (Triton 2.51 can crash on that race)."""
    from tritonclient.grpc import _infer_stream

    seen: list[bool] = []
    close = _infer_stream._InferStream.close

    def recording_close(stream, cancel_requests=False):
        iterator = stream._response_iterator
        if cancel_requests and iterator is not None and iterator.is_active():
            seen.append(True)
        return close(stream, cancel_requests)

    monkeypatch.setattr(_infer_stream._InferStream, "close", recording_close)
    return seen


def _talker_turn(request_id: str) -> TalkerRequest:
    tokens = np.arange(5, 9, dtype=np.int32)
    hidden = np.random.default_rng(len(request_id)).standard_normal((tokens.size, TINY_HIDDEN)).astype(np.float32)
    return TalkerRequest(request_id=request_id, condition_seq=0, token_ids=tokens, hidden=hidden, turn_start=True)


def _abandon_calls(clients: GrpcStageClients, worker: int, errors: list[str]) -> None:
    """The orchestrator's early end: stop reading after the first answer, then stop the request."""
    for i in range(ABANDONED_PER_WORKER):
        rid = f"ab{worker}-{i}.e0"
        calls = [("talker", clients.talker(_talker_turn(rid))),
                 ("thinker", clients.thinker(ThinkerRequest(request_id=rid, audio=np.zeros(16000, np.float32))))]
        for stage, results in calls:
            try:
                next(results)
            except (StageCallError, StopIteration) as exc:
                errors.append(f"{stage} {rid}: {exc!r}")
            results.close()
            clients.stop(stage, rid)


def test_abandoned_stage_calls_drain_without_a_cancel_and_leave_nothing(reliability_server, baseline, probes,
                                                                        live_cancels):
    clients = GrpcStageClients(reliability_server.grpc_url, secret=reliability_server.stage_secret)
    errors: list[str] = []
    try:
        workers = [threading.Thread(target=_abandon_calls, args=(clients, w, errors)) for w in range(WORKERS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120.0)
        assert errors == [] and not any(w.is_alive() for w in workers)
        deadline = time.monotonic() + 30.0  # a bound for FINALs on their way, not a timing
        while clients.draining_streams() and time.monotonic() < deadline:
            clients.close_idle_streams(idle_s=60.0)  # reads the late FINALs of pooled channels
            time.sleep(0.05)
        assert clients.draining_streams() == 0, "an abandoned request never sent its FINAL"
        # drained channels were reused: far fewer than the 2 x 36 abandoned calls
        assert clients.open_channels() <= 4 * WORKERS
    finally:
        clients.close()
    assert live_cancels == [], f"{len(live_cancels)} live stage streams were cancelled"
    after = settled(reliability_server, baseline)
    assert after.tracked() == baseline.tracked() and after.stubs == baseline.stubs
    probe = probes()  # the server still holds a conversation
    probe.start(**REPLY)
    probe.append(silence_units(3))
    probe.wait_type("response.done")
