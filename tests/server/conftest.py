"""A real tritonserver (cpu profile, tiny model) on free loopback ports, shared by the
server tests of one pytest run, plus a raw gRPC stream helper for protocol-level checks."""
from __future__ import annotations

import json
import queue
import threading
import uuid
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
from backends.serving.profiles import get_profile
from client.stream_close import stop_stream

RESPONSE_TIMEOUT_S = 60.0


from server_args import TEST_EXIT_ARGS  # noqa: E402 - the 5 s exit timeout of every test server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    workdir = PROJECT_ROOT / "var"  # the tiny checkpoint is cached here across runs
    options = ServerOptions(profile=get_profile("cpu").with_overrides({"idle_timeout_s": "20"}), workdir=workdir,
                            log_file=tmp_path_factory.mktemp("triton") / "server.log", extra_args=TEST_EXIT_ARGS)
    with ServerProcess(options) as proc:
        yield proc


# The reliability tests (tests/server/test_reliability_*.py) run on their own server: a 10 s idle
# timeout (the shared server's 20 s would make the idle test wait 20 s; a client-gone close, which
# must free a session before idle reaping could, took up to 4.5 s under load), a 320-token
# Thinker context (overflow after ~20 units instead of ~500) and fault injection on. Both would
# break or slow down the tests that need production-like settings on the shared server.
RELIABILITY_OVERRIDES = {"idle_timeout_s": "10", "max_context_tokens": "320", "fault_injection": "on"}


@pytest.fixture(scope="session")
def reliability_server(tmp_path_factory):
    options = ServerOptions(profile=get_profile("cpu").with_overrides(RELIABILITY_OVERRIDES),
                            workdir=PROJECT_ROOT / "var",
                            log_file=tmp_path_factory.mktemp("triton-reliability") / "server.log",
                            extra_args=TEST_EXIT_ARGS)
    with ServerProcess(options) as proc:
        yield proc


@pytest.fixture(scope="module")
def baseline(reliability_server):
    """The reliability server's resource gauges, warm and idle, as each module starts."""
    from server_resources import warm_baseline  # imports this conftest: not at module level

    return warm_baseline(reliability_server)


@pytest.fixture
def probes(reliability_server):
    """Session probes on the reliability server, each closed after the test."""
    from session_probe import ProbePool  # imports this conftest: not at module level

    pool = ProbePool(reliability_server.grpc_url)
    yield pool
    pool.close_all()


@dataclass
class Received:
    request_id: str
    final: bool
    event: dict | None = None
    audio: np.ndarray | None = None
    error: str | None = None


@dataclass
class RawStream:
    """One gRPC stream to `duplex`; every response is recorded with its request id."""

    url: str
    session_id: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:10]}")
    received: "queue.Queue[Received]" = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.client = grpcclient.InferenceServerClient(self.url)
        self.client.start_stream(callback=self._on_response)
        self._count = 0
        self._lock = threading.Lock()
        self.start_request_id: str | None = None
        self.ended = False
        self.created = False  # session.created arrived: the session holds its sequence until an END

    def _on_response(self, result, error) -> None:
        if error is not None:
            rid = getattr(error, "request_id", None) or ""
            self.received.put(Received(rid, True, error=str(error)))
            return
        resp = result.get_response()
        final = resp.parameters["triton_final_response"].bool_param
        event = audio = None
        if not final or result.as_numpy("EVENT") is not None:
            raw = result.as_numpy("EVENT")
            event = json.loads(raw[0]) if raw is not None else None
            audio = result.as_numpy("AUDIO_OUT")
            self.created = self.created or (event or {}).get("type") == "session.created"
        self.received.put(Received(resp.id, final, event, audio))

    def send(self, audio=None, start=False, end=False, inputs=None, **params) -> str:
        with self._lock:
            self._count += 1
            rid = f"{self.session_id}-{self._count}"
        tensors = inputs if inputs is not None else []
        if audio is not None:
            t = grpcclient.InferInput("AUDIO", list(audio.shape), _triton_dtype(audio))
            t.set_data_from_numpy(audio)
            tensors.append(t)
        if start:
            self.start_request_id = rid
        self.ended = self.ended or end
        self.client.async_stream_infer("duplex", tensors, request_id=rid, sequence_id=self.session_id,
                                       sequence_start=start, sequence_end=end, enable_empty_final_response=True,
                                       parameters=params or None)
        return rid

    def collect_until_final(self, request_id: str, timeout_s: float = RESPONSE_TIMEOUT_S) -> list[Received]:
        """Responses of `request_id` up to its FINAL; other requests' responses are kept."""
        mine, others = [], []
        try:
            while True:
                item = self.received.get(timeout=timeout_s)
                # tritonclient 2.51 drops the request id of in-band error responses: an
                # anonymous error answers the request we wait on (tests send one at a time).
                is_mine = item.request_id == request_id or (item.error is not None and not item.request_id)
                (mine if is_mine else others).append(item)
                if is_mine and item.final:
                    return mine
        finally:
            for item in others:
                self.received.put(item)

    def close(self) -> None:
        """END an open session (so it frees its admission slot now), then close the stream. A
        refused START needs no END: the server freed its sequence, and Triton would refuse one."""
        if self.created and not self.ended:
            try:
                self.send(end=True)
                self.collect_until_final(self.start_request_id, timeout_s=15)
            except queue.Empty:
                pass
        stop_stream(self.client, cancel=True)
        self.client.close()


def _triton_dtype(array: np.ndarray) -> str:
    return {np.int16: "INT16", np.float32: "FP32", np.int32: "INT32"}[array.dtype.type]


@pytest.fixture
def stream(server):
    streams = []

    def make(session_id: str | None = None) -> RawStream:
        s = RawStream(server.grpc_url) if session_id is None else RawStream(server.grpc_url, session_id)
        streams.append(s)
        return s

    yield make
    for s in streams:
        s.close()


