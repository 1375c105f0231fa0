"""Custom metrics on a real tritonserver (a server of its own, see the fixture): scrape /metrics around a
session and around bad requests, and compare with what the client saw.

Strategy: every count that follows from the client's own events is checked exactly as a
difference between two scrapes (sessions opened, TTFP observations and their sum, inter-chunk
gaps, responses by status, errors by code and channel); KV blocks in use are exact while the
session is the only one open (one session's reservation) and zero after it; step times only
have lower bounds (batching decides how many steps run), and so do the orchestrator's stage-call
latencies (switched on for this server). The readiness probe must find every model ready.
"""
from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backends.contracts.tensor_codec import encode_text
from backends.serving.health import probe
from backends.serving.metrics_catalog import parse_samples, sample_sum
from backends.serving.stage_secret import secret_parameters
from backends.stages.factory import SLOT_MARGIN
from client.events import AudioDelta, DuplexEvent, ResponseDone, ResponseListen, ResponseSpeak
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance
from client.wav import read_wav
from stub_exits import kernel_log, segfaults, stub_pids

DEMO_WAV = Path(__file__).resolve().parents[2] / "client" / "data" / "hello_16k.wav"
# The server rounds ttfp_ms to 0.1 ms before sending it and observing it: the sums agree up
# to float formatting of the /metrics page.
TTFP_SUM_TOLERANCE_MS = 0.01
SETTLE_S = 30.0  # a metric update trails its event by one queue hop; sessions of earlier tests may be closing


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of its own: the test compares exact counts and KV in use from an idle start,
    which sessions of earlier test modules on the shared server would disturb (in one full
    run the shared server still showed KV in use with no session open)."""
    from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    from server_args import TEST_EXIT_ARGS

    from backends.serving.metrics_stage_calls import CALL_METRICS_ENV

    options = ServerOptions(profile=get_profile("cpu").with_overrides({"idle_timeout_s": "20"}),
                            workdir=PROJECT_ROOT / "var", log_file=tmp_path_factory.mktemp("metrics") / "server.log",
                            extra_args=TEST_EXIT_ARGS)
    env = pytest.MonkeyPatch()
    env.setenv(CALL_METRICS_ENV, "1")  # the server's environment is taken when it starts
    try:
        with ServerProcess(options) as proc:
            env.undo()
            yield proc
    finally:
        env.undo()


def _scrape(server) -> dict:
    with urllib.request.urlopen(f"http://{server.options.address}:{server.metrics_port}/metrics", timeout=10) as r:
        return parse_samples(r.read().decode())


def _wait_for(server, predicate, what: str) -> dict:
    deadline = time.monotonic() + SETTLE_S
    while True:
        samples = _scrape(server)
        if predicate(samples):
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"metrics never showed {what}")
        time.sleep(0.05)


def _value(samples: dict, name: str, **labels: str) -> float:
    return sample_sum(samples, name, **labels)


def _blocks_per_session(samples: dict, stage: str, max_sessions: int) -> float:
    # Each runner is sized for max_sessions + SLOT_MARGIN requests and reserves one request's
    # whole context on admission (exact reservation).
    return _value(samples, "minicpmo_kv_blocks", model=stage) / (max_sessions + SLOT_MARGIN)


def test_a_session_shows_up_exactly_in_the_metrics(server):
    quiet = _wait_for(server, lambda s: _value(s, "minicpmo_active_sessions") == 0, "no open session")
    max_sessions = server.options.profile.max_sessions
    per_session = {stage: _blocks_per_session(quiet, stage, max_sessions) for stage in ("thinker", "talker")}
    assert all(v > 0 and v == int(v) for v in per_session.values()), per_session
    during: list[dict] = []
    events: list[DuplexEvent] = []

    def on_event(event: DuplexEvent) -> None:
        events.append(event)
        if isinstance(event, AudioDelta) and not during:  # Thinker and Talker hold this session now
            during.append(_wait_for(server, lambda s: all(
                _value(s, "minicpmo_kv_blocks_in_use", model=stage) == per_session[stage]
                for stage in per_session), "one session's KV reservation"))
            assert _value(during[0], "minicpmo_active_sessions") == 1

    params = SessionParams(initial_user_text="Tell me about the sea.", seed=3, reply_units=2,
                           reply_tokens_per_unit=4)
    with DuplexSession.connect(server.grpc_url, session_id="metrics-1") as session:
        report = stream_utterance(session, read_wav(DEMO_WAV).samples[:, 0], params,
                                  StreamConfig(speed=4.0, max_seconds=20), on_event=on_event)
    assert report.ok and during, report.errors
    after = _wait_for(server, lambda s: _value(s, "minicpmo_active_sessions") == 0
                      and _value(s, "minicpmo_kv_blocks_in_use") == 0, "the session closed and its KV freed")

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(quiet, name, **labels)

    audio = [e for e in events if isinstance(e, AudioDelta)]
    firsts = [e.ttfp_ms for e in audio if e.ttfp_ms is not None]
    responses_with_audio = {e.response_id for e in audio}
    completed = [e for e in events if isinstance(e, ResponseDone) and e.status == "completed"]
    decisions = [e for e in events if isinstance(e, (ResponseListen, ResponseSpeak))]
    assert audio and len(firsts) == len(responses_with_audio)
    assert delta("minicpmo_sessions_opened_total", model="duplex") == 1
    assert delta("minicpmo_ttfp_ms_count") == len(firsts)
    assert delta("minicpmo_ttfp_ms_sum") == pytest.approx(sum(firsts), abs=TTFP_SUM_TOLERANCE_MS * len(firsts))
    assert delta("minicpmo_inter_chunk_gap_ms_count") == len(audio) - len(responses_with_audio)
    assert delta("minicpmo_responses_total", status="completed") == len(completed) >= 1
    assert delta("minicpmo_errors_total") == 0
    assert delta("minicpmo_stage_step_ms_count", model="thinker") >= len(decisions) > 0
    assert delta("minicpmo_stage_step_ms_count", model="talker") > 0
    assert delta("minicpmo_stage_step_ms_count", model="code2wav") > 0
    calls = {stage: delta("minicpmo_stage_call_ms_count", model="duplex", stage=stage)
             for stage in ("thinker", "talker", "code2wav")}
    assert calls["thinker"] > 0 and calls["talker"] >= len(responses_with_audio), calls
    assert calls["code2wav"] >= len(responses_with_audio), calls
    for stage, count in calls.items():
        assert delta("minicpmo_stage_call_ms_bucket", model="duplex", stage=stage, le="+Inf") == count
        assert delta("minicpmo_stage_call_ms_sum", model="duplex", stage=stage) > 0
    waits = {kind: delta("minicpmo_code2wav_window_wait_ms_count", model="code2wav", kind=kind)
             for kind in ("first", "later")}
    assert waits["first"] == len(responses_with_audio), waits  # one first window a reply
    assert 0 < waits["first"] + waits["later"] <= calls["code2wav"], (waits, calls)
    inbox = {stage: delta("minicpmo_stage_inbox_wait_ms_count", model=stage) for stage in calls}
    assert inbox["thinker"] >= calls["thinker"] and inbox["talker"] >= calls["talker"], (inbox, calls)
    assert inbox["code2wav"] >= waits["first"] + waits["later"], (inbox, waits)  # each window went through
    # every orchestrator call carries its send time; each answer's last response is timed too
    arrivals = {stage: delta("minicpmo_stage_arrival_ms_count", model=stage) for stage in calls}
    sends = {stage: delta("minicpmo_stage_send_ms_count", model=stage) for stage in calls}
    assert all(arrivals[stage] >= calls[stage] for stage in calls), (arrivals, calls)
    assert all(sends[stage] >= arrivals[stage] for stage in calls), (sends, arrivals)
    assert all(delta("minicpmo_stage_arrival_ms_sum", model=stage) > 0 for stage in calls)


def test_errors_count_by_code_and_channel(server, stream):
    before = _scrape(server)
    session = stream("metrics-bad-append")
    session.send(start=True)
    rid = session.send(np.zeros(1600, np.int16), sample_rate=8000)  # the uplink must be 16 kHz
    [reply] = session.collect_until_final(rid)
    assert reply.error is not None and "invalid_argument" in reply.error
    _bad_stage_request(server.grpc_url, server.stage_secret)

    def errors(s: dict, **labels: str) -> float:
        return _value(s, "minicpmo_errors_total", **labels) - _value(before, "minicpmo_errors_total", **labels)

    after = _wait_for(server, lambda s: errors(s) >= 3, "three errors")
    # One bad append: the failed request (uplink) and the session's error event (downlink).
    assert errors(after, model="duplex", code="invalid_argument", channel="uplink") == 1
    assert errors(after, model="duplex", code="invalid_argument", channel="downlink") == 1
    assert errors(after, model="thinker", code="invalid_argument", channel="response") == 1
    assert errors(after) == 3


def _bad_stage_request(url: str, secret: str) -> None:
    """A thinker request with an unknown ACTION, straight to the stage with its secret: INVALID_ARG."""
    results: list = []
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.append(error))
    inputs = []
    for name, dtype, value in (("REQUEST_ID", "UINT8", encode_text("metrics-bad")),
                               ("AUDIO", "FP32", np.zeros(0, np.float32)),
                               ("ACTION", "UINT8", encode_text("explode"))):
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("thinker", inputs, request_id="metrics-bad", parameters=secret_parameters(secret))
    deadline = time.monotonic() + 30
    while not results and time.monotonic() < deadline:
        time.sleep(0.02)
    client.stop_stream()
    client.close()
    assert results and results[0] is not None and "ACTION must be" in str(results[0])


def test_readiness_probe_finds_every_model_ready(server):
    """Each stage answers its `health` request over a gRPC stream, as `duplex` calls it."""
    report = probe(server.http_url, server.stage_url)
    assert report.ready and report.models == {"duplex": "ok", "thinker": "ok", "talker": "ok", "code2wav": "ok"}
    assert server.is_ready()


def test_the_stubs_exit_cleanly_on_a_normal_stop(server):
    """Last in this module: it stops the module's server. Every stub had created metric
    families and gauges; a stop must finalize each model without a stub segfault (the 2.51
    stub's defect that backends/serving/stub_teardown.py works around) and without Triton
    seeing a non-graceful stub exit."""
    pids = stub_pids(server.process.pid)
    assert len(pids) == 4, pids  # duplex, thinker, talker, code2wav
    stopping = time.monotonic()  # the kernel's clock: older lines are of other processes with these pids
    assert server.stop() == 0
    log = server.log_file.read_text(errors="replace")
    assert "Non-graceful termination" not in log and "Signal (11)" not in log
    kernel = kernel_log()
    if kernel is None:
        pytest.skip("the kernel log cannot be read here: stub segfaults are not visible")
    assert segfaults(kernel, set(pids), since_s=stopping) == []
