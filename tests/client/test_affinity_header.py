"""The session-affinity header: DuplexSession sends its headers on the stream and on the
readiness call, `connect(affinity_header=...)` puts the session id in it, and
`minicpmo-client --affinity-header NAME` asks for it.

Strategy: a recording stand-in for InferenceServerClient (the real one would need a server);
the CLI test swaps `DuplexSession.connect` and checks what it was asked for.
"""
from __future__ import annotations

import pytest

import client.cli as cli
import client.session as session_module
from client.session import AFFINITY_HEADER, DuplexSession


class RecordingClient:
    def __init__(self, url: str = "") -> None:
        self.url = url
        self.calls: list[tuple[str, dict]] = []

    def is_model_ready(self, model_name: str, client_timeout: float | None = None, **kwargs) -> bool:
        self.calls.append(("is_model_ready", kwargs))
        return True

    def start_stream(self, callback, **kwargs) -> None:
        self.calls.append(("start_stream", kwargs))

    def async_stream_infer(self, model_name: str, inputs, **kwargs) -> None:
        self.calls.append(("async_stream_infer", {}))

    def stop_stream(self, cancel_requests: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


def test_connect_puts_the_session_id_in_the_affinity_header(monkeypatch):
    monkeypatch.setattr(session_module, "InferenceServerClient", RecordingClient)
    session = DuplexSession.connect("lb:8080", "sess-7", affinity_header=AFFINITY_HEADER)
    session.check_ready(1.0)
    session.start()
    calls = dict(session._client.calls)  # noqa: SLF001
    assert calls["is_model_ready"] == {"headers": {"x-session-id": "sess-7"}}
    assert calls["start_stream"] == {"headers": {"x-session-id": "sess-7"}}


def test_without_headers_the_calls_are_unchanged(monkeypatch):
    monkeypatch.setattr(session_module, "InferenceServerClient", RecordingClient)
    session = DuplexSession.connect("127.0.0.1:8001", "sess-8")
    session.check_ready(1.0)
    session.start()
    assert dict(session._client.calls)["start_stream"] == {}  # noqa: SLF001


def test_a_generated_session_id_is_the_header_value(monkeypatch):
    monkeypatch.setattr(session_module, "InferenceServerClient", RecordingClient)
    session = DuplexSession.connect("lb:8080", affinity_header="x-route")
    session.start()
    assert dict(session._client.calls)["start_stream"] == {"headers": {"x-route": session.session_id}}  # noqa: SLF001


@pytest.mark.parametrize("argv, expected", [
    (["--affinity-header", "x-session-id"], {"affinity_header": "x-session-id"}),
    ([], {}),
])
def test_cli_option_reaches_connect(monkeypatch, argv, expected):
    seen: list[dict] = []

    class Stop(Exception):
        pass

    def connect(url, session_id=None, *, model_name="duplex", **kwargs):
        seen.append(kwargs)
        raise Stop

    monkeypatch.setattr(DuplexSession, "connect", staticmethod(connect))
    with pytest.raises(Stop):
        cli.main(["--session-id", "s1", *argv])
    assert seen == [expected]
