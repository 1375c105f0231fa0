"""Tests for client/cli.py.

Strategy: run `main()` in-process with `DuplexSession.connect` pointed at
`FakeTritonClient`, at 20x real time, and check exit codes, the files written (reply wav,
JSON report), what the START request carried, and the printed summary. One test uses the real
tritonclient against a closed local port to pin the "server unreachable" path.
"""

import json
import socket

import numpy as np
import pytest

from client import cli
from client.session import DuplexSession
from client.wav import read_wav, write_wav

CHUNK = (np.arange(4800) % 400 - 200).astype(np.int16)  # 200 ms at 24 kHz, audible


def reply_on_first_append(fake, request):
    appends = [r for r in fake.uplink_requests() if fake.action_of(r) == "append"]
    if len(appends) != 1 or fake.action_of(request) != "append":
        return
    fake.emit({"type": "response.created", "response_id": "r1"})
    fake.emit({"type": "response.text.delta", "response_id": "r1", "text": "hi", "ttft_ms": 40})
    fake.emit({"type": "response.audio.delta", "response_id": "r1", "turn_id": 0, "text": "hi",
               "audio_ms": 200, "ttfp_ms": 90}, CHUNK)
    fake.emit({"type": "response.done", "response_id": "r1", "status": "completed"})
    fake.flush()  # answered before the append returns: no silence follows, whatever the load


@pytest.fixture
def connect_to(monkeypatch):
    def patch(fake):
        def connect(url, session_id=None, *, model_name="duplex"):
            return DuplexSession(fake, session_id or "cli-test", model_name=model_name)

        monkeypatch.setattr(DuplexSession, "connect", staticmethod(connect))

    return patch


def test_success_writes_reply_and_report(tmp_path, capsys, fake_client_factory, connect_to):
    fake = fake_client_factory(on_request=reply_on_first_append)
    connect_to(fake)
    code = cli.main([
        "--output", str(tmp_path / "reply.wav"), "--json", str(tmp_path / "report.json"),
        "--speed", "20", "--seed", "1", "--reply-units", "2", "--initial-user-text", "Hi there",
        "--session-id", "abc", "--force-listen-count", "0", "--temperature", "0", "--top-k", "5",
        "--top-p", "0.9", "--max-new-speak-tokens-per-chunk", "12", "--listen-prob-scale", "1.2",
        "--text-repetition-penalty", "1.1", "--text-repetition-window-size", "64", "--no-listen-when-silent",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    reply = read_wav(tmp_path / "reply.wav")
    assert (reply.sample_rate, reply.num_channels) == (24000, 1)
    np.testing.assert_array_equal(reply.samples[:, 0], CHUNK)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["session_id"] == "abc" and report["ok"] is True
    assert report["turns"][0]["server_ttfp_ms"] == 90
    start = fake.requests[0].parameters
    assert start["initial_user_text"].string_param == "Hi there"
    assert (start["reply_units"].int64_param, start["seed"].int64_param) == (2, 1)
    assert start["force_listen_count"].int64_param == 0
    assert (start["top_k"].int64_param, start["max_new_speak_tokens_per_chunk"].int64_param) == (5, 12)
    assert (start["top_p"].double_param, start["listen_prob_scale"].double_param) == (0.9, 1.2)
    assert (start["temperature"].double_param, start["text_repetition_penalty"].double_param) == (0.0, 1.1)
    assert start["text_repetition_window_size"].int64_param == 64
    assert start["listen_when_silent"].bool_param is False
    assert "TTFT client" in out and "server 40 ms" in out
    assert "TTFP client" in out and "server 90 ms" in out and "non-silent: yes" in out
    assert "response.audio.delta resp=r1" in out


def test_no_audio_exits_1_and_writes_no_wav(tmp_path, capsys, fake_client_factory, connect_to):
    connect_to(fake_client_factory())
    code = cli.main(["--output", str(tmp_path / "reply.wav"), "--speed", "20",
                     "--max-seconds", "0.4", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "no audio received" in out and "no finished response" in out
    assert not (tmp_path / "reply.wav").exists()
    assert "session.created" not in out  # --quiet


def test_non_16k_stereo_input_is_resampled(tmp_path, capsys, fake_client_factory, connect_to):
    stereo = np.zeros((8000, 2), dtype=np.int16)  # 1 s at 8 kHz
    write_wav(tmp_path / "in.wav", stereo, 8000)
    fake = fake_client_factory(on_request=reply_on_first_append)
    connect_to(fake)
    code = cli.main(["--input", str(tmp_path / "in.wav"), "--output", str(tmp_path / "r.wav"),
                     "--speed", "20", "--quiet"])
    assert code == 0
    assert "8000 Hz x 2 channels, resampled to 16000 Hz mono" in capsys.readouterr().out
    sent = sum(fake.audio_of(r).shape[0] for r in fake.uplink_requests())
    assert sent == 16000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "/nonexistent/in.wav"], "No such file"),
        (["--speed", "0"], "speed must be > 0"),
        (["--reply-units", "0"], "reply_units"),
        (["--url", "127.0.0.1"], "expected host:port or http(s)://host:port"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_unreachable_server_exits_1(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the client dials it
    assert cli.main(["--url", f"http://127.0.0.1:{port}", "--timeout", "5"]) == 1
    assert "cannot reach the server" in capsys.readouterr().err
