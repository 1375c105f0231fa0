"""The launcher's MPS daemon: when it starts, what its clients get, that it always stops.

A fake `nvidia-cuda-mps-control` on PATH records how it is called (the real one needs a GPU).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backends.serving import mps
from backends.serving.mps import CONTROL_BINARY, PIPE_ENV, MpsDaemon, mps_daemon

FAKE = """#!/bin/sh
# records argv, the pipe directory and stdin; exits with $FAKE_MPS_RC
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat -)" >> "{calls}"
exit ${{FAKE_MPS_RC:-0}}
"""


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    binary = bin_dir / CONTROL_BINARY
    binary.write_text(FAKE.format(calls=calls))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE", tmp_path / "no-host-daemon")
    return calls


def test_auto_is_off_on_cpu_and_without_the_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no binary anywhere
    assert mps_daemon("auto", "cpu", tmp_path) is None
    assert mps_daemon("auto", "cuda", tmp_path) is None
    assert mps_daemon("off", "cuda", tmp_path) is None
    with pytest.raises(RuntimeError, match="not found"):
        mps_daemon("on", "cuda", tmp_path)
    with pytest.raises(ValueError, match="mps must be one of"):
        mps_daemon("yes", "cuda", tmp_path)


def test_auto_leaves_an_mps_the_environment_configured(fake_binary: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIPE_ENV, "/somewhere/else")
    assert mps_daemon("auto", "cuda", tmp_path) is None
    assert mps_daemon("on", "cuda", tmp_path) is not None


def test_auto_leaves_a_host_wide_daemon_alone(fake_binary: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mps, "DEFAULT_PIPE", tmp_path / "nvidia-mps")
    assert mps_daemon("auto", "cuda", tmp_path) is not None
    (tmp_path / "nvidia-mps").mkdir()
    (tmp_path / "nvidia-mps" / "control").touch()  # a running daemon's control socket
    assert mps_daemon("auto", "cuda", tmp_path) is None


def test_start_hands_out_a_private_pipe_and_stop_quits_and_removes_it(fake_binary: Path,
                                                                      tmp_path: Path) -> None:
    daemon = mps_daemon("auto", "cuda", tmp_path / "logs")
    assert isinstance(daemon, MpsDaemon)
    daemon.start()
    env = daemon.environment()
    pipe = Path(env[PIPE_ENV])
    assert pipe.is_dir() and (tmp_path / "logs").is_dir()
    daemon.stop()
    daemon.stop()  # idempotent: one quit only
    calls = fake_binary.read_text().splitlines()
    assert calls == [f"args=-d pipe={pipe} stdin=", f"args= pipe={pipe} stdin=quit"]
    assert not pipe.exists()


def test_a_failed_start_raises_and_leaves_nothing(fake_binary: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_RC", "3")
    daemon = mps_daemon("on", "cuda", tmp_path / "logs")
    assert daemon is not None
    with pytest.raises(RuntimeError, match=r"-d failed \(3\)"):
        daemon.start()
    assert daemon.pipe_dir is not None and not daemon.pipe_dir.exists()
    daemon.stop()  # nothing started: no quit sent
    assert len(fake_binary.read_text().splitlines()) == 1


def test_launcher_accepts_the_modes() -> None:
    from backends.serving.launcher import parse_args

    assert parse_args([]).mps == "auto"
    assert parse_args(["--mps", "off"]).mps == "off"
    assert mps.MODES == ("auto", "on", "off")


def test_server_process_starts_its_daemon_for_gpu_profiles_and_stops_it(
        fake_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    server = ServerProcess(ServerOptions(get_profile("gpu"), workdir=tmp_path))
    env = server._start_mps()
    assert Path(env[PIPE_ENV]).is_dir() and server.mps is not None
    assert server.stop() is None  # no tritonserver started: the daemon still quits
    assert server.mps is None and not Path(env[PIPE_ENV]).exists()
    assert fake_binary.read_text().count("stdin=quit") == 1
    assert ServerProcess(ServerOptions(get_profile("cpu"), workdir=tmp_path))._start_mps() == {}
    monkeypatch.setenv("FAKE_MPS_RC", "1")  # auto: a daemon that fails to start is skipped
    assert ServerProcess(ServerOptions(get_profile("gpu"), workdir=tmp_path))._start_mps() == {}
    with pytest.raises(RuntimeError, match="failed"):
        ServerProcess(ServerOptions(get_profile("gpu"), workdir=tmp_path, mps="on"))._start_mps()


def test_a_start_that_cannot_run_the_binary_leaves_no_pipe_directory(tmp_path: Path) -> None:
    daemon = MpsDaemon(tmp_path / "logs", str(tmp_path / "missing-binary"))
    with pytest.raises(OSError):
        daemon.start()
    assert daemon.pipe_dir is not None and not daemon.pipe_dir.exists() and not daemon.started
