"""GrpcStageClients: stage calls on pooled gRPC channels, decoded into the stage contracts.

Strategy: a fake StageChannel replays scripted answers (tritonclient-like results, or an
error); the tests check what reaches the caller and which channels are reused or closed: a
stage's own error keeps the channel, a broken channel is closed, concurrent calls never share
one, an abandoned call's channel drains in the pool (never cancelled) until its FINAL. The real channel's stream handling runs in the server tests (every duplex session).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from backends.contracts.messages import ACTION_EXPECT, Code2WavAudio, TalkerCodes, TalkerRequest, stop_request
from backends.contracts.stage_clients import StageCallError
from backends.contracts.tensor_codec import to_arrays
from backends.serving.grpc_stages import GrpcStageClients

REQUEST = TalkerRequest(request_id="s.e0", condition_seq=0, token_ids=np.array([5, 6], np.int32),
                        hidden=np.zeros((2, 4), np.float32), turn_start=True)


class Result:
    def __init__(self, arrays):
        self._arrays = arrays

    def as_numpy(self, name):
        return self._arrays.get(name)


class FakeChannel:
    made: list["FakeChannel"] = []
    script: list = []  # per new stream: the answers of its calls, in order

    def __init__(self, url, timeout_s):
        self.calls, self.closed, self.usable, self.draining, self.late_final = [], False, True, False, False
        self.answers = list(FakeChannel.script.pop(0)) if FakeChannel.script else []
        self.has_stream, self.last_used, self.streams_ended = False, 0.0, 0
        FakeChannel.made.append(self)

    def end_stream(self):
        self.streams_ended += self.has_stream
        self.has_stream = self.draining = False

    def call(self, model, arrays):
        assert self.ready(), "a call on a channel whose last request is live"
        self.calls.append((model, arrays))
        self.has_stream, self.last_used, finished = True, time.monotonic(), False
        try:
            for answer in self.answers.pop(0):
                if isinstance(answer, StageCallError):
                    finished, self.usable = True, answer.error.code != "unavailable"  # the channel broke
                    raise answer
                yield Result(answer)
            finished = True
        finally:
            self.draining, self.late_final = not finished, False

    def post(self, model, arrays):
        assert self.ready(), "a post on a channel whose last request is live"
        self.calls.append((model, arrays))
        self.has_stream, self.last_used, self.draining, self.late_final = True, time.monotonic(), True, False

    def ready(self):
        self.draining = self.draining and not self.late_final  # the late FINAL arrived
        return self.usable and not self.draining

    def close(self, wait_s=5.0):
        self.closed, self.close_wait_s = True, wait_s


@pytest.fixture
def clients():
    FakeChannel.made, FakeChannel.script = [], []
    clients = GrpcStageClients("host:1", channel_factory=FakeChannel)
    yield clients
    clients.close()


def _codes(seq, finished):
    return to_arrays(TalkerCodes("s.e0", seq, np.arange(3, dtype=np.int32), finished))


def test_results_are_decoded_and_a_finished_stream_is_reused(clients):
    FakeChannel.script = [[[_codes(0, False), _codes(0, True)], []]]
    groups = list(clients.talker(REQUEST))
    assert [g.finished for g in groups] == [False, True] and groups[0].codes.tolist() == [0, 1, 2]
    clients.stop("talker", "s.e0")
    assert len(FakeChannel.made) == 1 and len(FakeChannel.made[0].calls) == 2, "the channel was not reused"
    model, arrays = FakeChannel.made[0].calls[1]
    assert model == "talker" and arrays.keys() == to_arrays(stop_request("talker", "s.e0")).keys()
    assert clients.open_channels() == 1


def test_a_stage_error_keeps_the_channel_and_a_broken_channel_is_closed(clients):
    from backends.contracts.errors import StageError

    FakeChannel.script = [[[StageCallError("talker", StageError("cancelled", "stopped"))],
                           [StageCallError("talker", StageError("unavailable", "connection lost"))]]]
    with pytest.raises(StageCallError, match="stopped"):
        list(clients.talker(REQUEST))
    assert not FakeChannel.made[0].closed and clients.open_channels() == 1
    with pytest.raises(StageCallError, match="connection lost"):
        list(clients.talker(REQUEST))
    assert FakeChannel.made[0].closed and clients.open_channels() == 0


def test_an_abandoned_call_drains_in_the_pool_and_is_reused_after_its_final(clients):
    FakeChannel.script = [[[_codes(0, False), _codes(0, True)], [_codes(2, True)]],
                          [[_codes(1, True)], [_codes(3, False), _codes(3, True)]]]
    calls = clients.talker(REQUEST)
    next(calls)
    calls.close()  # the consumer stopped: the request runs on, nothing is cancelled
    first = FakeChannel.made[0]
    assert first.draining and not first.closed and first.has_stream
    assert [g.condition_seq for g in clients.talker(REQUEST)] == [1]  # on a second channel
    assert len(FakeChannel.made) == 2 and clients.open_channels() == 2
    first.late_final = True
    held = clients.talker(REQUEST)
    assert next(held).condition_seq == 3  # the most recently used channel first ...
    assert [g.condition_seq for g in clients.talker(REQUEST)] == [2]  # ... then the drained one
    assert len(first.calls) == 2 and len(FakeChannel.made) == 2
    list(held)


def test_an_announcement_is_posted_on_a_pooled_channel_that_drains_its_final(clients):
    """`expect_window` sends Code2Wav its `expect` and returns at once: the channel waits in the
    pool for the FINAL nobody reads, then carries the next call."""
    FakeChannel.script = [[[to_arrays(Code2WavAudio("s.e0", 0, np.zeros(4, np.float32)))]]]
    clients.expect_window("s.e0")
    [channel] = FakeChannel.made
    [(model, arrays)] = channel.calls
    assert model == "code2wav" and arrays["REQUEST_ID"].tobytes() == b"s.e0"
    assert arrays["ACTION"].tobytes() == ACTION_EXPECT.encode() and channel.draining
    channel.late_final = True
    assert clients._checkout("code2wav") is channel  # ready again: reused, not a new channel
    clients._checkin("code2wav", channel)


def test_a_draining_channel_is_pooled_beyond_the_idle_cap_and_closed_after_the_timeout():
    FakeChannel.made, FakeChannel.script = [], [[[_codes(0, False), _codes(0, True)]]]
    clients = GrpcStageClients("host:1", channel_factory=FakeChannel, max_idle=0, timeout_s=30.0)
    try:
        calls = clients.talker(REQUEST)
        next(calls)
        calls.close()
        channel = FakeChannel.made[0]
        assert not channel.closed and clients.open_channels() == 1  # kept though the cap is 0
        assert clients.pool_gauges() == {"stage_channels": 1, "stage_idle_streams": 1, "stage_draining_streams": 1}
        channel.last_used -= 10.0
        assert clients.close_idle_streams(idle_s=2.0) == 0, "closed while its request may still end"
        channel.last_used -= 21.0
        assert clients.close_idle_streams(idle_s=2.0) == 1 and channel.streams_ended == 1
        assert channel.closed and clients.open_channels() == 0  # not draining any more: over the cap
    finally:
        clients.close()


def test_concurrent_calls_get_channels_of_their_own_and_close_shuts_the_idle_ones(clients):
    audio = to_arrays(Code2WavAudio("s.e0", 0, np.zeros(4, np.float32)))
    FakeChannel.script = [[[_codes(0, True)]], [[audio]]]
    talker = clients.talker(REQUEST)
    next(talker)  # a talker call in flight ...
    assert len(clients.code2wav(stop_request("code2wav", "s.e0"))) == 1  # ... a nested code2wav call
    list(talker)
    assert len(FakeChannel.made) == 2 and clients.open_channels() == 2
    clients.close()
    assert all(stream.closed for stream in FakeChannel.made) and clients.open_channels() == 0
    assert {stream.close_wait_s for stream in FakeChannel.made} == {1.0}, "close waited the long bound"


def test_idle_streams_are_closed_and_their_channels_stay_pooled(clients):
    FakeChannel.script = [[[_codes(0, True)], [_codes(1, True)]]]
    list(clients.talker(REQUEST))
    channel = FakeChannel.made[0]
    assert clients.idle_streams() == 1 and clients.close_idle_streams(idle_s=60.0) == 0
    channel.last_used -= 61.0
    assert clients.close_idle_streams(idle_s=60.0) == 1 and channel.streams_ended == 1
    assert clients.idle_streams() == 0 and clients.open_channels() == 1 and not channel.closed
    assert [g.condition_seq for g in clients.talker(REQUEST)] == [1] and len(FakeChannel.made) == 1


def test_the_closer_thread_ends_idle_streams_on_its_own_and_stops_with_close():
    FakeChannel.made, FakeChannel.script = [], [[[_codes(0, True)]]]
    clients = GrpcStageClients("host:1", channel_factory=FakeChannel, stream_idle_s=0.05)
    list(clients.talker(REQUEST))
    channel = FakeChannel.made[0]
    deadline = time.monotonic() + 30.0  # the closer looks every few hundredths of a second
    while not channel.streams_ended and time.monotonic() < deadline:  # it unpools the channel first
        time.sleep(0.01)
    assert clients.idle_streams() == 0 and channel.streams_ended == 1
    clients.close()
    assert not any(t.name == "stage-stream-closer" and t.is_alive() for t in threading.enumerate())
    assert channel.closed


class FakeResponse:
    def __init__(self, final: bool, outputs: bool) -> None:
        self.outputs = [object()] if outputs else []
        self.parameters = {"triton_final_response": type("P", (), {"bool_param": final})()}


class FakeError:
    def __init__(self, message: str, status: str | None = None) -> None:
        self._message, self._status = message, status

    def message(self) -> str:
        return self._message

    def status(self) -> str | None:
        return self._status


class FakeClient:
    """tritonclient's InferenceServerClient as StageChannel uses it: a stream per call."""

    answers: list = []  # (result, error) pairs the server sends for the next request

    def __init__(self, url: str) -> None:
        self.streams, self.stops, self._stream = 0, [], None  # stops: cancel_requests of each stop

    def start_stream(self, callback) -> None:
        self.streams += 1
        self._callback, self._stream = callback, object()

    def async_stream_infer(self, model, inputs, **kwargs) -> None:
        self.parameters = kwargs.get("parameters")
        for result, error in FakeClient.answers:
            self._callback(result=result, error=error)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.stops.append(cancel_requests)
        self._callback = self._stream = None

    def close(self) -> None:
        pass


class FakeResult:
    def __init__(self, final: bool, outputs: bool) -> None:
        self._response = FakeResponse(final, outputs)

    def get_response(self) -> FakeResponse:
        return self._response


@pytest.fixture
def channel(monkeypatch):
    from backends.serving import stage_channel

    monkeypatch.setattr(stage_channel.grpcclient, "InferenceServerClient", FakeClient)
    return stage_channel.StageChannel("host:1", timeout_s=0.2)


def test_a_channel_yields_results_with_outputs_up_to_the_final(channel):
    FakeClient.answers = [(FakeResult(False, True), None), (FakeResult(True, False), None)]
    assert len(list(channel.call("talker", to_arrays(REQUEST)))) == 1 and channel.usable


def test_a_finished_call_leaves_its_stream_open_for_the_next_call(channel):
    FakeClient.answers = [(FakeResult(True, True), None)]
    for _ in range(3):
        assert len(list(channel.call("talker", to_arrays(REQUEST)))) == 1
    assert channel._client.streams == 1 and channel.has_stream
    channel.close()
    assert not channel.has_stream and channel._client._callback is None


def test_a_call_that_ends_early_drains_on_its_stream_without_a_cancel(channel):
    FakeClient.answers = [(FakeResult(False, True), None)]  # the FINAL comes later
    calls = channel.call("talker", to_arrays(REQUEST))
    next(calls)
    calls.close()  # the caller stopped before the FINAL: the request is still live
    assert channel.draining and channel.has_stream and not channel.ready()
    with pytest.raises(RuntimeError, match="still live"):
        next(channel.call("talker", to_arrays(REQUEST)))
    channel._client._callback(result=FakeResult(False, True), error=None)  # a late result: still live
    assert not channel.ready()
    channel._client._callback(result=FakeResult(True, False), error=None)  # its FINAL
    assert channel.ready() and not channel.draining
    FakeClient.answers = [(FakeResult(True, True), None)]
    assert len(list(channel.call("talker", to_arrays(REQUEST)))) == 1
    assert channel._client.streams == 1 and channel._client.stops == [], "the stream was ended or cancelled"


def test_a_call_read_only_to_its_last_result_on_the_final_is_finished(channel):
    """A stage puts its last result on the FINAL: a caller that stops reading once it has it
    (a Thinker unit's one answer) leaves a channel ready for the next call, not draining."""
    FakeClient.answers = [(FakeResult(True, True), None)]
    calls = channel.call("thinker", to_arrays(REQUEST))
    next(calls)
    calls.close()
    assert not channel.draining and channel.ready()
    assert len(list(channel.call("thinker", to_arrays(REQUEST)))) == 1
    assert channel._client.streams == 1 and channel._client.stops == []


def test_a_posted_request_drains_until_its_final_or_its_stage_error(channel):
    FakeClient.answers = []  # the answers come later
    channel.post("code2wav", to_arrays(REQUEST))
    assert channel.draining and not channel.ready()
    channel._client._callback(result=FakeResult(True, False), error=None)
    assert channel.ready()
    channel.post("talker", to_arrays(REQUEST))  # a stage that refuses it: its error is the FINAL
    channel._client._callback(result=None, error=FakeError("[invalid_argument] ACTION must be ..."))
    assert channel.ready() and channel.usable
    assert channel._client.streams == 1 and channel._client.stops == []


@pytest.mark.parametrize("switch", ["1", "0"])
def test_requests_carry_their_send_time_only_with_the_call_metrics(monkeypatch, switch):
    from backends.serving import stage_channel
    from backends.serving.metrics_stage_calls import CALL_METRICS_ENV, SENT_NS_PARAMETER

    monkeypatch.setenv(CALL_METRICS_ENV, switch)
    monkeypatch.setattr(stage_channel.grpcclient, "InferenceServerClient", FakeClient)
    channel = stage_channel.StageChannel("host:1", timeout_s=0.2)
    FakeClient.answers = [(FakeResult(True, True), None)]
    before = time.monotonic_ns()
    list(channel.call("talker", to_arrays(REQUEST)))
    if switch == "0":
        assert channel._client.parameters is None
    else:
        assert before <= channel._client.parameters[SENT_NS_PARAMETER] <= time.monotonic_ns()


def test_a_draining_stream_ends_with_the_stage_error_or_breaks_with_a_stream_error(channel):
    for error, usable in ((FakeError("[cancelled] stopped"), True),
                          (FakeError("Socket closed", status="StatusCode.UNAVAILABLE"), False)):
        FakeClient.answers = [(FakeResult(False, True), None)]
        calls = channel.call("talker", to_arrays(REQUEST))
        next(calls)
        calls.close()
        channel._client._callback(result=None, error=error)
        assert channel.ready() is usable and not channel.draining
    channel.close()
    assert channel._client.stops == [False], "the stream was cancelled instead of half-closed"


def test_an_answer_that_arrives_between_calls_retires_the_stream(channel):
    FakeClient.answers = [(FakeResult(True, True), None)]
    list(channel.call("talker", to_arrays(REQUEST)))
    channel._client._callback(result=None, error=FakeError("Socket closed", status="StatusCode.UNAVAILABLE"))
    assert len(list(channel.call("talker", to_arrays(REQUEST)))) == 1  # on a new stream
    assert channel._client.streams == 2 and channel.usable


def test_a_stage_error_keeps_its_code_and_a_stream_error_marks_the_channel_broken(channel):
    FakeClient.answers = [(None, FakeError("[cancelled] talker request s.e0 was stopped"))]
    with pytest.raises(StageCallError) as stopped:
        list(channel.call("talker", to_arrays(REQUEST)))
    assert stopped.value.error.code == "cancelled" and channel.usable
    FakeClient.answers = [(None, FakeError("Socket closed", status="StatusCode.UNAVAILABLE"))]
    with pytest.raises(StageCallError) as lost:
        list(channel.call("talker", to_arrays(REQUEST)))
    assert lost.value.error.code == "unavailable" and not channel.usable


def test_a_stage_that_never_answers_times_out(channel):
    FakeClient.answers = [(FakeResult(False, True), None)]  # no FINAL ever
    calls = channel.call("talker", to_arrays(REQUEST))
    next(calls)
    with pytest.raises(StageCallError) as timeout:
        next(calls)
    assert timeout.value.error.code == "stage_timeout" and channel.draining and channel.usable
    channel.close(wait_s=1.0)
    assert not channel.has_stream and channel._client.stops == [False]


def test_the_launcher_points_duplex_at_its_own_grpc_port_on_loopback():
    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    ports = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}
    everywhere = ServerProcess(ServerOptions(profile=get_profile("cpu"), address="0.0.0.0", **ports))
    local = ServerProcess(ServerOptions(profile=get_profile("cpu"), address="127.0.0.2", **ports))
    assert everywhere.stage_url == "127.0.0.1:8001" and local.stage_url == "127.0.0.2:8001"
