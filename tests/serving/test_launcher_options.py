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
