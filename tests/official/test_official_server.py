"""`minicpmo-server --set checkpoint=DIR` on a checkpoint the official classes wrote.

Strategy: the launcher's own argument parsing (`--profile cpu --set checkpoint=DIR`) gives the
server options; the directory is the official tiny checkpoint (fp32 shards, the real tokenizer
files, no tokenizer.json, no `version`) with the tiny default voice and token2wav assets beside
it. One whole session with a forced reply shape must stream text and audio and close cleanly.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import pytest

from backends.serving.server_process import PROJECT_ROOT, ServerProcess

from backends.serving.launcher import parse_args, server_options
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance
from client.wav import read_wav

pytestmark = pytest.mark.server
DEMO_WAV = PROJECT_ROOT / "client" / "data" / "hello_16k.wav"


def test_the_server_serves_an_official_checkpoint(served: Callable[[str], Path],
                                                  tmp_path: Path) -> None:
    args = parse_args(["--profile", "cpu", "--set", f"checkpoint={served('float32')}",
                       "--workdir", str(PROJECT_ROOT / "var"), "--grpc-port", "0",
                       "--http-port", "0", "--metrics-port", "0"])
    options = dataclasses.replace(server_options(args), log_file=tmp_path / "server.log",
                                  extra_args=["--exit-timeout-secs=5"])
    params = SessionParams(initial_user_text="Tell me about the sea.", seed=3, reply_units=2,
                           reply_tokens_per_unit=4)
    events: list = []
    with ServerProcess(options) as server:
        with DuplexSession.connect(server.grpc_url, session_id="official-ckpt") as session:
            report = stream_utterance(session, read_wav(DEMO_WAV).samples[:, 0], params,
                                      StreamConfig(speed=2.0, max_seconds=30),
                                      on_event=events.append)
    assert report.ok and report.closed_cleanly, report.errors
    types = [e.type for e in events]
    assert "response.text.delta" in types and "response.audio.delta" in types
    assert types[-1] == "session.closed"
