"""The launcher's supervisor against a scripted server: when it restarts, when it leaves a
busy server alone, when it gives up, and that it keeps the dead server's log."""
from __future__ import annotations

from pathlib import Path

import pytest

from backends.serving.supervisor import Supervisor, SupervisorPolicy, keep_log


class ScriptedServer:
    """Each probe round takes the next (exited, ready) pair of the script."""

    def __init__(self, log_file: Path, script: list[tuple[str | None, bool]], start_fails: int = 0) -> None:
        self.log_file, self._script, self._start_fails = log_file, list(script), start_fails
        self.starts = self.stops = 0
        self._now: tuple[str | None, bool] = (None, True)
        self._down = False  # after a failed start: no process until the next start

    def advance(self) -> None:
        self._now = self._script.pop(0) if self._script else (None, True)

    def exited(self) -> str | None:
        return "is not running" if self._down else self._now[0]

    def is_ready(self) -> bool:
        return self._now[1]

    def start(self) -> None:
        self.starts += 1
        self.log_file.write_text(f"log of start {self.starts}\n")
        self._down = bool(self._start_fails)
        if self._start_fails:
            self._start_fails -= 1
            raise RuntimeError("tritonserver exited with 1; log: ...")
        self._now = (None, True)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        self.stops += 1
        return 0


def _run(server: ScriptedServer, rounds: int, policy: SupervisorPolicy) -> tuple[int, Supervisor, list[str]]:
    said: list[str] = []
    clock = [0.0]
    left = [rounds]

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        left[0] -= 1
        server.advance()

    supervisor = Supervisor(server, policy, say=said.append, clock=lambda: clock[0], sleep=sleep)
    return supervisor.run(lambda: left[0] < 0), supervisor, said


def test_a_dead_server_is_restarted_and_its_log_kept(tmp_path):
    server = ScriptedServer(tmp_path / "triton.log", [(None, True), ("was killed by SIGABRT", False)])
    server.log_file.write_text("Signal (6) received.\n")
    code, supervisor, said = _run(server, rounds=5, policy=SupervisorPolicy())
    assert code == 0 and server.starts == 1
    assert [r.reason for r in supervisor.restarts] == ["was killed by SIGABRT"]
    assert (tmp_path / "triton.log.previous").read_text() == "Signal (6) received.\n"
    assert server.log_file.read_text() == "log of start 1\n"
    assert any("restarting" in line for line in said) and any("ready again" in line for line in said)


def test_failed_probes_restart_only_once_they_run_in_a_row(tmp_path):
    policy = SupervisorPolicy(unhealthy_after=3)
    busy = [(None, False), (None, False), (None, True)] * 3  # never three in a row
    server = ScriptedServer(tmp_path / "triton.log", busy)
    assert _run(server, rounds=len(busy), policy=policy)[0] == 0 and server.starts == 0
    server = ScriptedServer(tmp_path / "triton.log", [(None, True)] + [(None, False)] * 3)
    code, supervisor, _ = _run(server, rounds=6, policy=policy)
    assert code == 0 and server.starts == 1
    assert supervisor.restarts[0].reason == "failed 3 readiness probes in a row"


def test_a_server_that_keeps_dying_is_given_up(tmp_path):
    policy = SupervisorPolicy(max_restarts=2, restart_window_s=100.0, probe_interval_s=1.0)
    server = ScriptedServer(tmp_path / "triton.log", [("exited with code 134", False)] * 10)
    code, supervisor, said = _run(server, rounds=10, policy=policy)
    assert code == 1 and server.starts == 2 and len(supervisor.restarts) == 2
    assert "giving up" in said[-1]


def test_old_restarts_leave_the_window(tmp_path):
    # one death every 2 s of clock; a window of 3 s holds at most two restarts at a time
    policy = SupervisorPolicy(max_restarts=2, restart_window_s=3.0, probe_interval_s=2.0)
    server = ScriptedServer(tmp_path / "triton.log", [("exited with code 134", False)] * 6)
    code, _, _ = _run(server, rounds=6, policy=policy)
    assert code == 0 and server.starts == 6


def test_a_failed_restart_counts_and_the_next_round_tries_again(tmp_path):
    server = ScriptedServer(tmp_path / "triton.log", [("exited with code 1", False)], start_fails=1)
    code, supervisor, said = _run(server, rounds=4, policy=SupervisorPolicy())
    assert code == 0 and server.starts == 2
    assert supervisor.restarts[0].ready_after_s is None and supervisor.restarts[1].ready_after_s is not None
    assert any("restart failed" in line for line in said)


def test_no_restarts_when_max_restarts_is_zero(tmp_path):
    server = ScriptedServer(tmp_path / "triton.log", [("exited with code 0", False)])
    assert _run(server, rounds=3, policy=SupervisorPolicy(max_restarts=0))[0] == 1
    assert server.starts == 0


def test_keep_log_without_a_log(tmp_path):
    assert keep_log(tmp_path / "none.log") == tmp_path / "none.log.previous"
    assert not (tmp_path / "none.log.previous").exists()


@pytest.mark.parametrize("argv", [["--max-restarts", "-1"], ["--restart-window-s", "0"]])
def test_bad_supervisor_options_are_usage_errors(argv, capsys):
    from backends.serving.launcher import main

    assert main(argv) == 2
    assert "--max-restarts must be" in capsys.readouterr().err
