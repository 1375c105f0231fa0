"""`minicpmo-server` supervises its tritonserver: killed from outside (as an abort inside
Triton would end it), the server is restarted on the same ports, the open session's client is
told `server_restarting`, and a new session then works. One launcher of its own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from backends.serving.server_process import PROJECT_ROOT, free_port
from client.errors import DuplexStreamError
from client.events import SessionCreated
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance
from client.wav import read_wav
from perf.soak_processes import children_named
from stub_exits import stub_pids

DEMO_WAV = PROJECT_ROOT / "client" / "data" / "hello_16k.wav"
READY_TIMEOUT_S = 240.0


def _wait_for_line(path: Path, needle: str, timeout_s: float, launcher: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in path.read_text(errors="replace"):
            return
        if launcher.poll() is not None:
            pytest.fail(f"the launcher exited with {launcher.returncode}:\n{path.read_text()[-3000:]}")
        time.sleep(0.25)
    pytest.fail(f"no {needle!r} from the launcher within {timeout_s:.0f} s:\n{path.read_text()[-3000:]}")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tritonserver_pid(launcher_pid: int) -> int:
    pids = children_named(launcher_pid, "tritonserver")
    assert len(pids) == 1, f"the launcher's tritonserver children: {pids}"
    return pids[0]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("supervised")
    ports = {name: free_port() for name in ("http", "grpc", "metrics")}
    output = tmp / "launcher.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backends.serving.launcher", "--profile", "cpu",
             "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
             "--metrics-port", str(ports["metrics"]), "--log-file", str(tmp / "triton.log"),
             "--set", "idle_timeout_s=20"],
            cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_line(output, "tritonserver ready", READY_TIMEOUT_S, proc)
        yield proc, f"127.0.0.1:{ports['grpc']}", output, tmp / "triton.log"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _open_session(url: str, session_id: str) -> DuplexSession:
    session = DuplexSession.connect(url, session_id=session_id)
    session.start(SessionParams(initial_user_text="Hello.", seed=1, reply_units=1, reply_tokens_per_unit=4))
    event = session.next_event(60)
    assert isinstance(event, SessionCreated), event
    return session


def test_a_killed_server_is_restarted_and_its_clients_told(launcher):
    proc, url, output, triton_log = launcher
    server_pid = _tritonserver_pid(proc.pid)
    before = stub_pids(server_pid)
    session = _open_session(url, "restart-1")
    try:
        os.kill(server_pid, signal.SIGKILL)
        with pytest.raises(DuplexStreamError) as broken:
            for _ in range(200):  # appends until the broken stream surfaces
                session.append(np.zeros(3200, np.int16))
                session.events_until(time.monotonic() + 0.05)
        assert broken.value.code == "server_restarting", broken.value
    finally:
        session.close()
    _wait_for_line(output, "ready again", READY_TIMEOUT_S, proc)
    text = output.read_text()
    assert "tritonserver was killed by SIGKILL: restarting" in text
    assert (triton_log.parent / "triton.log.previous").exists()
    new_pid = _tritonserver_pid(proc.pid)
    assert new_pid != server_pid and len(stub_pids(new_pid)) == len(before) == 4
    # the dead server's stubs do not outlive the restart (a `duplex` stub used to hang in exit)
    assert not [pid for pid in before if _alive(pid)], "stubs of the killed server are still running"
    with DuplexSession.connect(url, session_id="restart-2") as fresh:
        report = stream_utterance(fresh, read_wav(DEMO_WAV).samples[:, 0],
                                  SessionParams(initial_user_text="Hello.", seed=2, reply_units=1,
                                                reply_tokens_per_unit=4),
                                  StreamConfig(speed=4.0, max_seconds=20))
    assert report.ok, report.errors
    assert proc.poll() is None  # still supervising
