"""Readiness: a stage answers `health` from its engine thread's liveness, and the probe turns
Triton's model readiness and the stages' answers into one report.

Strategy: a real StageAdapter over a fake pb_utils, whose engine thread is killed by a
BaseException escaping a step (what no containment catches) -> the health action flips from
an empty FINAL to UNAVAILABLE. The probe talks to a loopback HTTP server that plays Triton's
readiness endpoints (200 for a loaded model, 400 otherwise) and sends its health requests on
fake stage channels that answer as scripted (nothing: an empty FINAL; or a StageCallError),
and its `duplex` probe to a fake that answers as scripted too. The real channel and the real
`duplex` probe ask a real server in tests/server/test_metrics_server.py and
tests/server/test_duplex_health_server.py.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pathlib import Path

import pytest

from backends.contracts.stage_clients import STAGES, StageCallError
from backends.serving import health
from backends.serving.duplex_health import ask_duplex
from backends.serving.health import MODELS, OK, default_grpc_url, main, probe, server_ready
from backends.serving.server_process import free_port
from backends.serving.stage_channel import StageChannel
from backends.serving.stage_health import ACTION_HEALTH, health_request
from backends.serving.triton_stage import StageAdapter
from backends.contracts.messages import TalkerRequest
from backends.contracts.errors import StageError
from backends.contracts.tensor_codec import to_arrays

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"

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


class FakeChannel:
    """A StageChannel whose health calls answer from `answers` (stage -> error, or none: OK)."""

    answers: dict[str, StageCallError] = {}
    made: list["FakeChannel"] = []

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.calls, self.closed = url, [], False
        FakeChannel.made.append(self)

    def call(self, model: str, arrays: dict):
        self.calls.append((model, arrays))
        if model in self.answers:
            raise self.answers[model]
        return iter(())

    def close(self, wait_s: float) -> None:
        self.closed = True


class FakeTriton(BaseHTTPRequestHandler):
    loaded: set[str] = set(MODELS)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v2/health/ready":
            ready = self.loaded >= set(MODELS)
        else:
            ready = self.path.removeprefix("/v2/models/").removesuffix("/ready") in self.loaded
        self.send_response(200 if ready else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class FakeDuplex:
    """`ask_duplex` as scripted: None (serves) or why not; records the addresses asked."""

    answer: str | None = None
    asked: list[str] = []

    @classmethod
    def ask(cls, grpc_url: str, timeout_s: float) -> str | None:
        cls.asked.append(grpc_url)
        return cls.answer


@pytest.fixture
def fake_triton(monkeypatch):
    FakeChannel.answers, FakeChannel.made = {}, []
    FakeDuplex.answer, FakeDuplex.asked = None, []
    monkeypatch.setattr(health, "StageChannel", FakeChannel)
    monkeypatch.setattr(health, "ask_duplex", FakeDuplex.ask)
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTriton)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_probe_asks_every_model_of_the_repository():
    assert sorted(MODELS) == sorted(d.name for d in REPOSITORY.iterdir() if (d / "1" / "model.py").exists())


def test_a_ready_server_sends_each_stage_one_health_request(fake_triton, capsys):
    report = probe(fake_triton, "stages:1")
    assert report.ready and report.models == {model: OK for model in MODELS}
    channels = sorted(FakeChannel.made, key=lambda c: c.calls[0][0])
    assert [(c.url, [m for m, _ in c.calls], c.closed) for c in channels] == \
        [("stages:1", [stage], True) for stage in sorted(STAGES)], "one channel per stage, closed after"
    for channel in channels:
        [(stage, arrays)] = channel.calls
        assert bytes(arrays["ACTION"]).decode() == ACTION_HEALTH
        assert bytes(arrays["REQUEST_ID"]).decode() == health_request(stage).request_id
    assert FakeDuplex.asked == ["stages:1"], "duplex is probed once, over gRPC"
    assert server_ready(fake_triton, "stages:1") and main(["--url", fake_triton, "--grpc-url", "stages:1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ready": True, "models": {model: OK for model in MODELS}}


def test_the_report_names_what_cannot_serve(fake_triton, monkeypatch, capsys):
    monkeypatch.setattr(FakeTriton, "loaded", set(MODELS) - {"code2wav"})
    FakeChannel.answers = {
        "talker": StageCallError("talker", StageError("unavailable", "[talker] the engine thread is not running")),
        "thinker": StageCallError("thinker", StageError("internal", "Stub process 'thinker_0_0' is not healthy.")),
    }
    report = probe(fake_triton, "stages:1")
    assert not report.ready and report.down == ["code2wav", "talker", "thinker"]
    assert report.models == {"duplex": OK, "code2wav": "not loaded (HTTP 400)",
                             "talker": "[unavailable] [talker] the engine thread is not running",
                             "thinker": "[internal] Stub process 'thinker_0_0' is not healthy."}
    assert "code2wav" not in [m for c in FakeChannel.made for m, _ in c.calls], "an unloaded stage is not asked"
    assert not server_ready(fake_triton, "stages:1")
    assert not server_ready(fake_triton, "stages:1", check_stages=False), "a model is not loaded: Triton's own fails"
    assert main(["--url", fake_triton, "--grpc-url", "stages:1"]) == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["models"]["talker"].startswith("[unavailable]")


def test_a_loaded_server_whose_stage_failed_is_ready_only_to_triton(fake_triton):
    FakeChannel.answers = {"code2wav": StageCallError("code2wav", StageError("stage_timeout", "no answer"))}
    assert server_ready(fake_triton, "stages:1", check_stages=False)
    assert not server_ready(fake_triton, "stages:1")


def test_a_dead_duplex_stub_makes_the_server_not_ready(fake_triton, capsys):
    """Triton still calls `duplex` loaded; its failed probe is what tells."""
    FakeDuplex.answer = "Stub process 'duplex_0_0' is not healthy."
    report = probe(fake_triton, "stages:1")
    assert report.down == ["duplex"] and report.models["duplex"] == FakeDuplex.answer
    assert server_ready(fake_triton, "stages:1", check_stages=False), "Triton's own readiness misses it"
    assert not server_ready(fake_triton, "stages:1")
    assert main(["--url", fake_triton, "--grpc-url", "stages:1"]) == 1
    assert json.loads(capsys.readouterr().out)["models"]["duplex"] == FakeDuplex.answer


def test_an_unloaded_duplex_is_not_probed(fake_triton, monkeypatch):
    monkeypatch.setattr(FakeTriton, "loaded", set(MODELS) - {"duplex"})
    assert probe(fake_triton, "stages:1").models["duplex"] == "not loaded (HTTP 400)"
    assert FakeDuplex.asked == []


def test_the_models_are_asked_together(fake_triton, monkeypatch):
    """Models that are slow to answer cost the probe one wait, not one each."""
    def slow_call(self, model, arrays):
        time.sleep(1.0)
        return iter(())

    def slow_duplex(grpc_url, timeout_s):
        time.sleep(1.0)

    monkeypatch.setattr(FakeChannel, "call", slow_call)
    monkeypatch.setattr(health, "ask_duplex", slow_duplex)
    start = time.monotonic()
    assert probe(fake_triton, "stages:1").ready
    assert time.monotonic() - start < 2.5, "four 1-second answers, asked one after another"


def test_the_grpc_address_defaults_to_the_http_host():
    assert default_grpc_url("http://10.0.0.5:8000") == "10.0.0.5:8001"
    assert default_grpc_url("http://replica-a") == "replica-a:8001"
    assert default_grpc_url("http://[::1]:8000") == "[::1]:8001"


def test_nothing_listening_is_not_ready(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert not server_ready(url, timeout_s=2)
    assert main(["--url", url, "--timeout", "2"]) == 1
    assert json.loads(capsys.readouterr().out)["ready"] is False


def test_an_unreachable_grpc_port_fails_every_model(fake_triton, monkeypatch):
    """The real channel and the real `duplex` probe to a port nothing listens on: every model
    is down, at once (the stream fails before or after the request is queued; either way it
    is the reported reason)."""
    monkeypatch.setattr(health, "ask_duplex", ask_duplex)
    start = time.monotonic()
    report = probe(fake_triton, f"127.0.0.1:{free_port()}", timeout_s=5, channel_factory=StageChannel)
    assert report.down == sorted(MODELS)
    assert time.monotonic() - start < 5, "a refused connection is not a timeout"


def test_the_probe_takes_either_address_form(fake_triton, capsys):
    """host:port as the client takes it, or the http:// form: the same probe."""
    hostport = fake_triton.removeprefix("http://")
    assert main(["--url", hostport, "--grpc-url", "http://stages:1"]) == 0
    assert FakeDuplex.asked == ["stages:1"]
    assert json.loads(capsys.readouterr().out)["ready"] is True


@pytest.mark.parametrize("argv", [["--url", "ftp://host:8000"], ["--url", "host:port"],
                                  ["--grpc-url", "host"], ["--grpc-url", "https://host:8001"]])
def test_a_malformed_address_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "host:port" in capsys.readouterr().err


def test_the_probe_reads_the_launchers_endpoints_file(fake_triton, tmp_path, capsys):
    from backends.serving.endpoints import Endpoints

    port = int(fake_triton.rsplit(":", 1)[1])
    path = Endpoints.serving("0.0.0.0", port, 1).write(tmp_path / "endpoints.json")
    assert Endpoints.read(path) == Endpoints(f"127.0.0.1:{port}", "127.0.0.1:1")
    FakeChannel.answers = {}
    assert main(["--endpoints", str(path)]) == 0
    assert FakeDuplex.asked == ["127.0.0.1:1"], "the gRPC port of the file, not Triton's default"
    capsys.readouterr()


@pytest.mark.parametrize("content, message", [(None, "no server is ready yet"), ("{}", "not an endpoints file")])
def test_no_endpoints_file_is_not_ready(tmp_path, capsys, content, message):
    path = tmp_path / "endpoints.json"
    if content is not None:
        path.write_text(content)
    assert main(["--endpoints", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is False and message in report["error"]
