"""Readiness: a stage answers `health` from its engine thread's liveness, the health model
turns stage answers into one report, and the probe reads that report over HTTP.

Strategy: a real StageAdapter over a fake pb_utils, whose engine thread is killed by a
BaseException escaping a step (what no containment catches) -> the health action flips from
an empty FINAL to UNAVAILABLE. The health model runs on scripted BLS answers; the probe talks
to a loopback HTTP server that plays Triton's two answers (200 with the report, 503 with the
error).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fake_pb_utils
import pytest

from backends.serving.health import NOT_READY_PREFIX, OK, HealthReport, main, probe, server_ready
from backends.serving.health_model import HealthModel, health_request
from backends.serving.launcher import free_port
from backends.serving.triton_stage import StageAdapter
from backends.stages.contracts import TalkerRequest
from backends.stages.tensor_codec import to_arrays

WAIT_S = 30.0  # a bound for what happens at once


class EngineDeath(BaseException):
    """Escapes every `except Exception`: the engine thread ends."""


class DyingEngine:
    def __init__(self) -> None:
        self.die = threading.Event()

    def submit(self, request, sink) -> None:
        self.die.set()

    def stop(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return self.die.is_set()

    def step(self) -> None:
        raise EngineDeath("the engine thread dies here")


def _health(pb, adapter: StageAdapter):
    request = pb.request_from_arrays(to_arrays(health_request("talker")))
    adapter.execute([request])
    assert request.sender.done.wait(WAIT_S), "no FINAL for the health request"
    return request.sender.sent


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_stage_health_fails_once_its_engine_thread_died(pb):
    engine = DyingEngine()
    adapter = StageAdapter(pb, "talker", TalkerRequest, engine)
    assert _health(pb, adapter) == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    adapter.execute([pb.request_from_arrays(to_arrays(TalkerRequest(
        request_id="s.e0", condition_seq=0, token_ids=health_request("talker").token_ids,
        hidden=health_request("talker").hidden)))])
    deadline = time.monotonic() + WAIT_S
    while adapter.engine_thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    [(response, flags)] = _health(pb, adapter)
    assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert response.error().code() == pb.TritonError.UNAVAILABLE
    assert "engine thread is not running" in response.error().message()
    adapter.finalize()


def _ok() -> list[fake_pb_utils.InferenceResponse]:
    return [fake_pb_utils.InferenceResponse()]


def test_health_model_reports_every_stage(pb):
    pb.bls_answers.update(thinker=_ok, talker=_ok, code2wav=_ok)
    model = HealthModel(pb, {"stages": "thinker,talker,code2wav"})
    [response] = model.execute([object()])
    assert not response.has_error()
    report = HealthReport.from_json(response.output_tensors()[0].as_numpy()[0].decode())
    assert report.ready and report.stages == {"thinker": OK, "talker": OK, "code2wav": OK}


def test_health_model_names_the_stages_that_cannot_serve(pb):
    def dead_stub():
        raise RuntimeError("Stub process 'code2wav_0_0' is not healthy.")

    pb.bls_answers.update(
        thinker=_ok, code2wav=dead_stub,
        talker=lambda: [pb.InferenceResponse(error=pb.TritonError(
            "[unavailable] [talker] the engine thread is not running", pb.TritonError.UNAVAILABLE))])
    model = HealthModel(pb, {})
    responses = model.execute([object(), object(), object()])
    assert sorted(pb.bls_calls) == ["code2wav", "talker", "thinker"], "one check answers the whole batch"
    for response in responses:
        assert response.error().code() == pb.TritonError.UNAVAILABLE
        message = response.error().message()
        assert message.startswith(NOT_READY_PREFIX)
        report = HealthReport.from_json(message[len(NOT_READY_PREFIX):])
        assert not report.ready and report.down == ["code2wav", "talker"]
        assert report.stages["thinker"] == OK and "not healthy" in report.stages["code2wav"]


def test_health_model_refuses_unknown_stages(pb):
    with pytest.raises(ValueError, match="stages"):
        HealthModel(pb, {"stages": "thinker,vocoder"})


class FakeTriton(BaseHTTPRequestHandler):
    report = HealthReport({"thinker": OK})

    def do_GET(self) -> None:  # noqa: N802
        self._reply(200 if self.path == "/v2/health/ready" else 404, {})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.report.ready:
            body = {"outputs": [{"name": "STATUS", "datatype": "BYTES", "shape": [1],
                                 "data": [self.report.to_json()]}]}
            self._reply(200, body)
        else:
            self._reply(503, {"error": NOT_READY_PREFIX + self.report.to_json()})

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_triton():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTriton)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probe_and_readiness_follow_the_report(fake_triton, monkeypatch, capsys):
    assert probe(fake_triton).ready and server_ready(fake_triton) and main(["--url", fake_triton]) == 0
    monkeypatch.setattr(FakeTriton, "report", HealthReport({"thinker": OK, "talker": "engine gone"}))
    report = probe(fake_triton)
    assert not report.ready and report.down == ["talker"]
    assert not server_ready(fake_triton) and server_ready(fake_triton, check_stages=False)
    assert main(["--url", fake_triton]) == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["stages"]["talker"] == "engine gone"


def test_nothing_listening_is_not_ready(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert not server_ready(url, timeout_s=2)
    assert main(["--url", url, "--timeout", "2"]) == 1
    assert json.loads(capsys.readouterr().out)["ready"] is False
