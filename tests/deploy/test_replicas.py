"""Two replicas behind nginx on loopback, configured by deploy/nginx/minicpmo-grpc.conf:
sessions stay on one replica, and a replica that loses a stage reports not ready.

Strategy: two cpu-profile servers (tiny model, max_sessions 2, named with Triton's --id) and
nginx running the example configuration with only its addresses replaced. Server metadata
fetched through nginx with an `x-session-id` header tells which replica a session id hashes
to; ids are picked so both replicas get sessions. Each session then sends its START on one
gRPC stream and its audio and END on a second stream (a reconnect, or a front end forwarding
uplink audio): with affinity every request finds the session, and each replica's metrics count
exactly its own sessions. A negative control shows what affinity prevents (a continuation on
the other replica is refused: that server never saw the sequence's START). Finally the thinker stub of one replica is
killed: Triton still calls that replica ready, our readiness does not, the other stays ready.
This module starts its own two servers (the shared fixture is one server).
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backends.serving.health import probe
from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess, free_port
from backends.serving.metrics_catalog import parse_samples, sample_sum
from backends.serving.profiles import get_profile
from perf.soak_processes import stub_of
from client.session import AFFINITY_HEADER
from client.stream_close import stop_stream

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
EXAMPLE = PROJECT_ROOT / "deploy" / "nginx" / "minicpmo-grpc.conf"
REPLICAS = ("replica-a", "replica-b")
SESSIONS_PER_REPLICA = 2
CANDIDATE_IDS = 40  # ids probed to find SESSIONS_PER_REPLICA per replica (all on one side: 2**-39)
TIMEOUT_S = 60.0
UNIT = np.zeros(16000, np.int16)  # [16000] int16: one 1-second unit of silence at 16 kHz

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs nginx-light)")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs = tmp_path_factory.mktemp("replicas")
    profile = get_profile("cpu").with_overrides({"max_sessions": "2", "idle_timeout_s": "20"})
    servers = {name: ServerProcess(ServerOptions(
        profile=profile, workdir=PROJECT_ROOT / "var", log_file=logs / f"{name}.log",
        # A replica with a killed stage cannot finish a graceful exit; do not wait 20 s for it.
        extra_args=[f"--id={name}", "--exit-timeout-secs=5"])) for name in REPLICAS}
    _parallel(lambda s: s.start(), servers.values())
    try:
        yield servers
    finally:
        _parallel(lambda s: s.stop(timeout_s=30), servers.values())


def _parallel(fn, items) -> None:
    errors: list[BaseException] = []
    threads = [threading.Thread(target=lambda i=i: _capture(fn, i, errors)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _capture(fn, item, errors) -> None:
    try:
        fn(item)
    except BaseException as exc:  # re-raised by _parallel on the calling thread
        errors.append(exc)


@pytest.fixture(scope="module")
def balancer(replicas, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("nginx")
    port = free_port()
    (run_dir / "minicpmo-grpc.conf").write_text(_example_with(
        [s.grpc_port for s in replicas.values()], port))
    conf = run_dir / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
daemon off;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {run_dir}/body;
    proxy_temp_path {run_dir}/proxy;
    fastcgi_temp_path {run_dir}/fastcgi;
    uwsgi_temp_path {run_dir}/uwsgi;
    scgi_temp_path {run_dir}/scgi;
    include {run_dir}/minicpmo-grpc.conf;
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(run_dir), "-e", str(run_dir / "error.log"), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, run_dir / "error.log")
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGQUIT)  # graceful: finish open streams
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _example_with(grpc_ports: list[int], listen_port: int) -> str:
    """The example configuration with our replicas' addresses and a free listen port."""
    text = EXAMPLE.read_text()
    servers = re.findall(r"^    server 127\.0\.0\.1:\d+;$", text, flags=re.M)
    assert len(servers) == len(grpc_ports), "the example must list two replicas"
    for line, port in zip(servers, grpc_ports):
        text = text.replace(line, f"    server 127.0.0.1:{port};", 1)
    text, count = re.subn(r"listen \d+ http2;", f"listen 127.0.0.1:{listen_port} http2;", text)
    assert count == 1 and "hash $http_x_session_id consistent;" in text
    return text


def _wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"nginx exited with {proc.returncode}: {log.read_text() if log.exists() else ''}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail("nginx did not listen")


def _replica_of(url: str, session_id: str) -> str:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.get_server_metadata(headers={AFFINITY_HEADER: session_id}).name
    finally:
        client.close()


@pytest.fixture(scope="module")
def routing(balancer) -> dict[str, str]:
    """session id -> replica, as nginx's hash places it."""
    return {sid: _replica_of(balancer, sid) for sid in (f"aff-{i}" for i in range(CANDIDATE_IDS))}


@dataclass
class Stream:
    """One gRPC stream (through `url`) carrying requests of one session, with the affinity header."""

    url: str
    session_id: str
    received: "queue.Queue[tuple[str, bool, dict | None, str | None]]" = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.client = grpcclient.InferenceServerClient(self.url)
        self.client.start_stream(callback=self._on_response, headers={AFFINITY_HEADER: self.session_id})

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.received.put(("", True, None, str(error)))
            return
        response = result.get_response()
        raw = result.as_numpy("EVENT")
        event = json.loads(raw[0]) if raw is not None else None
        self.received.put((response.id, response.parameters["triton_final_response"].bool_param, event, None))

    def send(self, request_id: str, start: bool = False, end: bool = False, audio: np.ndarray | None = None) -> None:
        tensors = []
        if audio is not None:
            tensors.append(grpcclient.InferInput("AUDIO", list(audio.shape), "INT16"))
            tensors[0].set_data_from_numpy(audio)
        self.client.async_stream_infer("duplex", tensors, request_id=request_id, sequence_id=self.session_id,
                                       sequence_start=start, sequence_end=end, enable_empty_final_response=True)

    def until_final(self, request_id: str) -> tuple[list[dict], list[str]]:
        """Events and errors of `request_id` up to its FINAL (or its first error)."""
        return self._read(request_id, lambda final, events: final)

    def until_event(self, request_id: str, event_type: str) -> tuple[list[dict], list[str]]:
        return self._read(request_id, lambda final, events: final or (events and events[-1]["type"] == event_type))

    def _read(self, request_id: str, done) -> tuple[list[dict], list[str]]:
        events, errors = [], []
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            rid, final, event, error = self.received.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                errors.append(error)
                return events, errors
            if rid == request_id:
                events += [event] if event else []
                if done(final, events):
                    return events, errors

    def close(self) -> None:
        stop_stream(self.client, cancel=True)
        self.client.close()


def _split_session(url: str, session_id: str) -> tuple[list[dict], list[str]]:
    """START on one stream; audio and END on a second one. Returns (downlink events, uplink errors)."""
    downlink, uplink = Stream(url, session_id), None
    try:
        downlink.send("down", start=True)
        # The second stream takes over once the session exists (as after a reconnect): two
        # streams are two connections, so nothing else orders its requests after the START.
        created, uplink_errors = downlink.until_event("down", "session.created")
        uplink = Stream(url, session_id)
        for i, (audio, end) in enumerate(((UNIT, False), (None, True))):
            uplink.send(f"up-{i}", end=end, audio=audio)
            uplink_errors += uplink.until_final(f"up-{i}")[1]
        events, down_errors = downlink.until_final("down")
        return created + events, uplink_errors + down_errors
    finally:
        for stream in (downlink, uplink):
            if stream is not None:
                stream.close()


def _metrics(server: ServerProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as resp:
        return parse_samples(resp.read().decode())


def test_each_session_stays_on_the_replica_its_id_hashes_to(replicas, balancer, routing):
    assert set(routing.values()) == set(REPLICAS)
    assert all(_replica_of(balancer, sid) == name for sid, name in list(routing.items())[:6]), "hash is stable"
    chosen = {name: [sid for sid, n in routing.items() if n == name][:SESSIONS_PER_REPLICA] for name in REPLICAS}
    for name, sids in chosen.items():
        assert len(sids) == SESSIONS_PER_REPLICA, f"too few ids hash to {name}"
        for sid in sids:
            events, errors = _split_session(balancer, sid)
            assert not errors, f"{sid} on {name}: {errors}"
            types = [e["type"] for e in events]
            assert types[0] == "session.created" and types[-1] == "session.closed", types
            assert events[-1]["reason"] == "client" and "error" not in types, events
    deadline = time.monotonic() + 30  # a bound for metric updates on their way, not a timing
    while True:
        samples = {name: _metrics(server) for name, server in replicas.items()}
        if all(sample_sum(s, "minicpmo_active_sessions") == 0 for s in samples.values()) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name, s in samples.items():
        assert sample_sum(s, "minicpmo_sessions_opened_total") == SESSIONS_PER_REPLICA, name
        assert sample_sum(s, "minicpmo_active_sessions") == 0, name
        assert sample_sum(s, "minicpmo_errors_total") == 0, name


def test_without_affinity_a_continuation_misses_its_session(replicas):
    a, b = (replicas[name] for name in REPLICAS)
    home, elsewhere = Stream(a.grpc_url, "no-affinity"), Stream(b.grpc_url, "no-affinity")
    try:
        home.send("down", start=True)
        home.until_event("down", "session.created")
        elsewhere.send("up", audio=UNIT)
        _, errors = elsewhere.until_final("up")
        # Triton's sequence batcher of the other replica has never seen the sequence.
        assert len(errors) == 1 and "must specify the START flag" in errors[0], errors
        home.send("end", end=True)
        events, errors = home.until_final("down")
        assert not errors and events[-1]["type"] == "session.closed", (events, errors)
    finally:
        home.close()
        elsewhere.close()


def test_a_replica_that_lost_a_stage_is_not_ready(replicas):
    healthy, broken = (replicas[name] for name in REPLICAS)
    assert broken.is_ready() and probe(broken.http_url, broken.stage_url).ready
    os.kill(stub_of(broken.process.pid, "thinker"), signal.SIGKILL)
    report = probe(broken.http_url, broken.stage_url)
    assert not report.ready and report.down == ["thinker"], report
    # the server's hand-off to a dead stub ends after its ten-second wait (stub_wait_patch.py),
    # about when the probe's own timeout ends: either says so
    assert "not healthy" in report.models["thinker"] or "no answer" in report.models["thinker"], report
    assert not broken.is_ready()
    with urllib.request.urlopen(f"{broken.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200, "Triton alone still calls it ready: the gap the stage health check closes"
    assert healthy.is_ready() and probe(healthy.http_url, healthy.stage_url).ready
