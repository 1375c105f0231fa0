"""The launcher refuses what cannot work in one line, before it starts anything: a malformed or
unknown `--set`, an unknown profile, and a stage-call diagnostics setting the models would
refuse at load (backends/serving/launcher.py `server_options`)."""
from __future__ import annotations

import pytest

from backends.serving.metrics_stage_calls import CALL_METRICS_ENV


@pytest.mark.parametrize(("argv", "environ", "message"), [
    (["--set", "max_sessions"], {}, "--set takes NAME=VALUE"),
    (["--set", "no_such_variable=1"], {}, "unknown configuration variables"),
    (["--profile", "no_such_profile"], {}, "unknown profile"),
    ([], {CALL_METRICS_ENV: "on"}, f"{CALL_METRICS_ENV} must be 0 or 1, got 'on'"),
    (["--profile", "gpu-h200", "--set", "max_sessions=128"], {}, "the largest session count that fits is"),
])
def test_the_launcher_refuses_bad_settings_in_one_line_before_starting_anything(
        argv, environ, message, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from backends.serving import launcher

    monkeypatch.delenv(CALL_METRICS_ENV, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launcher, "ServerProcess", None)  # reaching it would fail the test loudly
    assert launcher.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("minicpmo launcher: ") and message in err and "Traceback" not in err


def test_each_server_start_gets_its_own_private_stage_secret(tmp_path):
    import stat

    from backends.serving.server_process import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile
    from backends.serving.stage_secret import SECRET_FILE_ENV, configured_secret

    first, second = (ServerProcess(ServerOptions(get_profile("cpu"), workdir=tmp_path)) for _ in range(2))
    environ = first.write_stage_secret()
    second.write_stage_secret()
    assert configured_secret(environ) == first.stage_secret != second.stage_secret
    assert stat.S_IMODE(first.stage_secret_file.stat().st_mode) == 0o600
    assert str(first.stage_secret_file).startswith(str(tmp_path)) and SECRET_FILE_ENV in environ
    first.stop()  # nothing started: the secret goes anyway
    assert not first.stage_secret_file.exists() and second.stage_secret_file.exists()


@pytest.mark.parametrize("profile", ["gpu", "gpu-split"])
def test_render_only_writes_a_gpu_rendering_and_the_plain_command_without_a_server(
        profile, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from backends.serving import launcher
    from backends.serving.repository import TEMPLATE_NAME

    monkeypatch.setattr(launcher, "ServerProcess", None)  # reaching it would fail the test loudly
    dest = tmp_path / "repo"
    argv = ["--profile", profile, "--render-only", str(dest), "--workdir", str(tmp_path / "w"),
            "--grpc-port", "9101", "--set", "max_sessions=8"]
    assert launcher.main(argv) == 0
    thinker = (dest / "thinker" / "config.pbtxt").read_text()
    assert "KIND_GPU" in thinker and "gpus: [ 0 ]" in thinker
    assert not list(dest.glob(f"*/{TEMPLATE_NAME}")), "templates are rendered, not copied"
    assert (dest / "duplex" / "1" / "model.py").exists()
    out = capsys.readouterr().out
    assert f"rendered profile {profile} into {dest}" in out
    assert f"--model-repository={dest}" in out and "--grpc-port=9101" in out
    assert "--backend-config=python,shm-default-byte-size=16777216" in out


def test_the_plain_command_puts_this_pythons_libpython_first(tmp_path):
    from backends.serving.server_process import ServerOptions, plain_command
    from backends.serving.profiles import get_profile
    from backends.serving.triton_install import python_libdir

    line = plain_command(ServerOptions(get_profile("cpu"), workdir=tmp_path, grpc_port=8001), tmp_path / "r")
    assert line.startswith(f"LD_LIBRARY_PATH={python_libdir()}:")
    assert "triton_python_backend_stub" not in line and "tritonserver --model-repository=" in line
    assert (tmp_path / "triton" / "backends" / "python" / "triton_python_backend_stub").exists() \
        or "/opt/tritonserver" in line, "the wheel's stub is prepared for this Python"


def test_the_launcher_tells_the_health_check_where_it_serves(tmp_path):
    from backends.serving.endpoints import Endpoints
    from backends.serving.server_process import ServerOptions, ServerProcess, write_endpoints
    from backends.serving.profiles import get_profile

    server = ServerProcess(ServerOptions(get_profile("cpu"), workdir=tmp_path, address="0.0.0.0",
                                         http_port=9000, grpc_port=9001, metrics_port=9002))
    path = write_endpoints(server)
    assert path == tmp_path / "endpoints.json"
    assert Endpoints.read(path) == Endpoints("127.0.0.1:9000", "127.0.0.1:9001")


def test_render_only_without_a_tritonserver_prints_the_container_line(tmp_path, monkeypatch, capsys):
    from backends.serving import launcher, server_process

    def no_triton(scratch):
        raise RuntimeError("no tritonserver on PATH and nvidia-pytriton is not installed")

    monkeypatch.setattr(server_process, "find_triton", no_triton)
    dest = tmp_path / "repo"
    assert launcher.main(["--profile", "gpu", "--render-only", str(dest), "--workdir", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "no tritonserver here" in out
    assert f"tritonserver --model-repository={dest} --backend-config=python,shm-default-byte-size=" in out
