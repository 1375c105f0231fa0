"""The per-stage wrapper stub for MPS client priority (backends/serving/stub_priority.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from backends.serving.stub_priority import (
    LOW_PRIORITY_ENV, SM_PERCENT_ENV, STUB_NAME, install_wrappers, low_priority_stages, sm_percents,
    stage_environments, stages_from_environment,
)

BELOW_NORMAL = {"CUDA_MPS_CLIENT_PRIORITY": "1"}


def test_stage_lists_are_parsed_and_checked():
    assert low_priority_stages(" code2wav, talker,code2wav ") == ("code2wav", "talker")
    assert low_priority_stages("") == () and low_priority_stages(" None ") == ()
    assert stages_from_environment({}) is None and stages_from_environment({LOW_PRIORITY_ENV: " "}) is None
    assert stages_from_environment({LOW_PRIORITY_ENV: "code2wav"}) == ("code2wav",)
    assert stages_from_environment({LOW_PRIORITY_ENV: "none"}) == ()
    with pytest.raises(ValueError, match="vocoder is not a stage"):
        low_priority_stages("code2wav,vocoder")


def test_the_wrapper_runs_the_real_stub_with_its_arguments_at_below_normal_priority(tmp_path: Path):
    real = tmp_path / "real_stub"
    real.write_text('#!/bin/sh\necho "priority=$CUDA_MPS_CLIENT_PRIORITY args=$*"\nexit 1\n')
    real.chmod(0o755)
    repo = tmp_path / "repo"
    for stage in ("thinker", "code2wav"):
        (repo / stage).mkdir(parents=True)
    (wrapper,) = install_wrappers(repo, {"code2wav": BELOW_NORMAL}, real)
    assert wrapper == repo / "code2wav" / STUB_NAME and not (repo / "thinker" / STUB_NAME).exists()
    run = subprocess.run(["bash", "-c", f" exec {wrapper} /m/code2wav/1/model.py shm 1 2"],
                         capture_output=True, text=True, check=False)
    assert run.stdout.strip() == "priority=1 args=/m/code2wav/1/model.py shm 1 2"
    assert run.returncode == 1  # Triton's startup probe runs the stub bare and expects 1
    with pytest.raises(ValueError, match="no model directory"):
        install_wrappers(repo, {"talker": BELOW_NORMAL}, real)
    with pytest.raises(ValueError, match="no Python backend stub"):
        install_wrappers(repo, {"code2wav": BELOW_NORMAL}, tmp_path / "missing_stub")
    assert install_wrappers(repo, {}, tmp_path / "missing_stub") == []  # nothing asked, nothing checked


def test_the_launcher_takes_the_stages_on_its_command_line():
    from backends.serving.launcher import parse_args

    assert parse_args([]).mps_low_priority is None  # then the environment decides
    assert parse_args(["--mps-low-priority", "code2wav,talker"]).mps_low_priority == ("code2wav", "talker")
    with pytest.raises(SystemExit):
        parse_args(["--mps-low-priority", "vocoder"])


def test_no_stage_is_below_normal_by_default_and_a_list_wins(tmp_path: Path):
    """None (no option, no environment) means no stage, with an MPS daemon or without one (on an
    H200, Code2Wav at normal priority measured better since the fourteenth session); an explicit
    list wins either way."""
    from backends.serving.launcher import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile
    from backends.serving.stub_priority import DEFAULT_LOW_PRIORITY

    def stages(option, with_mps: bool) -> tuple[str, ...]:
        server = ServerProcess(ServerOptions(get_profile("cpu"), workdir=tmp_path, mps_low_priority=option))
        server.mps = object() if with_mps else None  # type: ignore[assignment]
        return server.low_priority_stages()

    assert DEFAULT_LOW_PRIORITY == ()
    assert stages(None, with_mps=True) == () and stages(None, with_mps=False) == ()
    assert stages(("code2wav",), with_mps=True) == ("code2wav",)
    assert stages((), with_mps=True) == () and stages(("talker",), with_mps=False) == ("talker",)


def test_sm_caps_are_parsed_and_checked():
    assert sm_percents("") == {} and sm_percents(" code2wav=50 , talker=100") == {"code2wav": 50, "talker": 100}
    for bad, match in (("vocoder=50", "'vocoder' is not a stage"), ("code2wav=0", "1-100"),
                       ("code2wav=101", "1-100"), ("code2wav", "1-100"), ("code2wav=half", "1-100")):
        with pytest.raises(ValueError, match=match):
            sm_percents(bad)
    assert SM_PERCENT_ENV == "MINICPMO_MPS_SM_PERCENT"


def test_a_stub_gets_its_priority_and_its_sm_cap_together(tmp_path: Path):
    envs = stage_environments(["talker"], {"code2wav": 50, "talker": 80})
    assert envs == {"talker": {**BELOW_NORMAL, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80"},
                    "code2wav": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}}
    real = tmp_path / "real_stub"
    real.write_text('#!/bin/sh\necho "priority=$CUDA_MPS_CLIENT_PRIORITY sms=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"\n')
    real.chmod(0o755)
    for stage in envs:
        (tmp_path / "repo" / stage).mkdir(parents=True)
    outputs = {path.parent.name: subprocess.run([str(path)], capture_output=True, text=True, check=True).stdout.strip()
               for path in install_wrappers(tmp_path / "repo", envs, real)}
    assert outputs == {"talker": "priority=1 sms=80", "code2wav": "priority= sms=50"}


def test_the_sm_caps_apply_only_under_an_mps_daemon(tmp_path: Path):
    from backends.serving.launcher import ServerOptions, ServerProcess
    from backends.serving.profiles import get_profile

    server = ServerProcess(ServerOptions(get_profile("cpu"), workdir=tmp_path, mps_sm_percent={"code2wav": 50}))
    assert server.stage_environments() == {}
    server.mps = object()  # type: ignore[assignment]
    assert server.stage_environments() == {"code2wav": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}}


@pytest.mark.parametrize(("argv", "environ", "message"), [
    ([], {SM_PERCENT_ENV: "code2wav=150"}, "needs a whole percentage in 1-100"),
    ([], {LOW_PRIORITY_ENV: "vocoder"}, "vocoder is not a stage"),
    (["--set", "max_sessions"], {}, "--set takes NAME=VALUE"),
    (["--set", "no_such_variable=1"], {}, "unknown configuration variables"),
    (["--profile", "no_such_profile"], {}, "unknown profile"),
    ([], {"MINICPMO_STAGE_CALL_METRICS": "off"}, "MINICPMO_STAGE_CALL_METRICS must be 0 or 1, got 'off'"),
])
def test_the_launcher_refuses_bad_settings_in_one_line_before_starting_anything(
        argv, environ, message, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from backends.serving import launcher

    monkeypatch.delenv(SM_PERCENT_ENV, raising=False)
    monkeypatch.delenv(LOW_PRIORITY_ENV, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launcher, "ServerProcess", None)  # reaching it would fail the test loudly
    assert launcher.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("minicpmo launcher: ") and message in err and "Traceback" not in err
