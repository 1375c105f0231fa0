"""The stage secret: stage models serve only requests that carry the server's secret.

Strategy: the secret file and the guard's comparison on their own; then a real StageAdapter over
the fake pb_utils with a recording engine: a request without the secret, or with a wrong one, is
answered `[forbidden]` and never reaches the engine (no submit, no stop), `health` is answered
either way, and with the secret every action goes through. The orchestrator's channel puts the
secret on every request (tests/serving/test_grpc_stages.py fakes the gRPC client the same way);
the real server's refusal is tests/server/test_stage_guard.py.
"""
from __future__ import annotations

import json
import stat
import threading

import numpy as np
import pytest

from backends.contracts.messages import ThinkerRequest, stop_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving import stage_channel
from backends.serving.stage_health import health_request
from backends.serving.stage_secret import (
    SECRET_FILE_ENV, SECRET_PARAMETER, StageGuard, configured_secret, new_secret, read_secret_file,
    secret_parameters, write_secret_file,
)
from backends.serving.triton_stage import StageAdapter

WAIT_S = 5.0
SECRET = "s3cret-" + "ab" * 28


class RecordingEngine:
    """Records what reaches it; runs nothing."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.stopped: list[str] = []

    def submit(self, request, sink) -> None:
        self.submitted.append(request.request_id)
        sink.close()

    def stop(self, request_id: str) -> None:
        self.stopped.append(request_id)

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass


def test_the_secret_file_is_private_and_read_back(tmp_path):
    path = write_secret_file(tmp_path / "run" / "stage", SECRET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret_file(path) == SECRET
    path.chmod(0o644)
    write_secret_file(path, "other")  # rewriting a file that others could read makes it private again
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_secret_file(path) == "other"


def test_new_secrets_are_long_and_distinct():
    first, second = new_secret(), new_secret()
    assert first != second and len(first) == 64


def test_the_environment_names_the_file(tmp_path):
    path = write_secret_file(tmp_path / "secret", SECRET)
    assert configured_secret({SECRET_FILE_ENV: str(path)}) == SECRET
    assert configured_secret({}) is None and configured_secret({SECRET_FILE_ENV: ""}) is None
    with pytest.raises(ValueError, match="cannot read"):  # a guard that was asked for must not vanish
        configured_secret({SECRET_FILE_ENV: str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        configured_secret({SECRET_FILE_ENV: str(tmp_path / "empty")})


@pytest.mark.parametrize("parameters,allowed", [
    (json.dumps({SECRET_PARAMETER: SECRET}), True),
    (json.dumps({SECRET_PARAMETER: SECRET, "sent_ns": 5}), True),
    ("{}", False),
    ("", False),
    (json.dumps({SECRET_PARAMETER: SECRET[:-1]}), False),
    (json.dumps({SECRET_PARAMETER: SECRET + "0"}), False),
    (json.dumps({SECRET_PARAMETER: 7}), False),
    (json.dumps({SECRET_PARAMETER: "\ud800"}), False),
    (json.dumps([SECRET]), False),
    ("{not json", False),
])
def test_the_guard_compares_the_parameter(parameters, allowed):
    assert StageGuard(SECRET).allows(parameters) is allowed


def test_without_a_secret_every_request_is_allowed():
    guard = StageGuard(None)
    assert not guard.enabled and guard.allows("{}") and guard.allows("")
    assert secret_parameters(None) == {} and secret_parameters(SECRET) == {SECRET_PARAMETER: SECRET}


def _send(pb, adapter: StageAdapter, message, parameters: dict | None = None):
    request = pb.request_from_arrays(to_arrays(message))
    request.parameters_json = json.dumps(parameters or {})
    adapter.execute([request])
    assert request.sender.done.wait(WAIT_S), "no FINAL"
    return request.sender.sent


def _drain(adapter: StageAdapter) -> None:
    """Wait until the engine thread has run every command posted before."""
    done = threading.Event()
    adapter.engine_thread.call(done.set)
    assert done.wait(WAIT_S)


def _setup_request(request_id: str) -> ThinkerRequest:
    return ThinkerRequest(request_id=request_id, audio=np.zeros(0, np.float32), seq=0)


@pytest.fixture
def guarded(pb):
    engine = RecordingEngine()
    adapter = StageAdapter(pb, "thinker", ThinkerRequest, engine, guard=StageGuard(SECRET))
    yield adapter, engine
    adapter.finalize()


@pytest.mark.parametrize("parameters", [None, {SECRET_PARAMETER: "wrong"}, {"sent_ns": 1}])
def test_a_request_without_the_secret_is_forbidden_before_the_engine(pb, guarded, parameters):
    adapter, engine = guarded
    for message in (_setup_request("x.e0"), stop_request("thinker", "victim.e0")):
        [(response, flags)] = _send(pb, adapter, message, parameters)
        assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        assert response.error().message().startswith("[forbidden] [thinker]")
        assert response.error().code() == pb.TritonError.INVALID_ARG
    _drain(adapter)
    assert engine.submitted == [] and engine.stopped == []
    adapter.finalize()  # flushes the metrics thread, which counts the refusals after the FINALs
    assert pb.value("minicpmo_errors_total", model="thinker", code="forbidden") == 2


def test_health_needs_no_secret(pb, guarded):
    adapter, _ = guarded
    assert _send(pb, adapter, health_request("thinker")) == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]


def test_with_the_secret_requests_reach_the_engine(pb, guarded):
    adapter, engine = guarded
    _send(pb, adapter, _setup_request("x.e0"), {SECRET_PARAMETER: SECRET})
    _send(pb, adapter, stop_request("thinker", "x.e0"), {SECRET_PARAMETER: SECRET})
    _drain(adapter)
    assert engine.submitted == ["x.e0"] and engine.stopped == ["x.e0"]


def test_an_unguarded_stage_serves_anyone_and_says_so(pb):
    engine = RecordingEngine()
    adapter = StageAdapter(pb, "thinker", ThinkerRequest, engine, guard=StageGuard(None))
    try:
        _send(pb, adapter, _setup_request("x.e0"))
        _drain(adapter)
        assert engine.submitted == ["x.e0"]
        assert any(level == "warn" and "no stage secret" in line for level, line in pb.Logger.lines)
    finally:
        adapter.finalize()


class RecordingClient:
    """tritonclient's InferenceServerClient, recording each streamed request's parameters."""

    def __init__(self, url: str) -> None:
        self.parameters: list[dict | None] = []

    def start_stream(self, callback) -> None:
        pass

    def async_stream_infer(self, model, inputs, **kwargs) -> None:
        self.parameters.append(kwargs.get("parameters"))


def test_the_orchestrators_channel_sends_the_secret_on_every_request(monkeypatch):
    monkeypatch.setattr(stage_channel.grpcclient, "InferenceServerClient", RecordingClient)
    channel = stage_channel.StageChannel("host:1", timeout_s=0.2, secret=SECRET)
    channel.post("thinker", to_arrays(stop_request("thinker", "a.e0")))
    channel.draining = False  # nothing answers here: let the next request go
    channel.post("code2wav", to_arrays(stop_request("code2wav", "a.e0")))
    assert channel._client.parameters == [{SECRET_PARAMETER: SECRET}] * 2
    plain = stage_channel.StageChannel("host:1", timeout_s=0.2)
    plain.post("thinker", to_arrays(stop_request("thinker", "a.e0")))
    assert plain._client.parameters == [None]
