"""A `minicpmo-server` (backends/serving/launcher.py) run as a subprocess for the soak, and what
its output says about server deaths.

The launcher supervises its tritonserver (backends/serving/supervisor.py) and says on stderr
when it restarts one: `tritonserver <reason>: restarting (...)`, then `tritonserver ready again
after <s> s` or `tritonserver restart failed: ...`, and `...: giving up` once its restart budget
is spent. Its stdout and stderr go to one file, parsed after the fact.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perf.soak_processes import children_named

PROJECT_ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "tritonserver ready:"
RESTARTING = re.compile(r"^tritonserver (?P<reason>.+): restarting \(")
READY_AGAIN = re.compile(r"^tritonserver ready again after (?P<seconds>[0-9.]+) s")
RESTART_FAILED = "tritonserver restart failed:"
GIVING_UP = re.compile(r"^tritonserver .+: giving up$")


@dataclass(frozen=True, slots=True)
class LauncherEvents:
    """Server deaths the launcher saw and how its restarts went."""

    restarts: tuple[str, ...] = ()  # the reason of each restart: one death (or hang) each
    ready_again_s: tuple[float, ...] = ()
    failed_restarts: int = 0
    given_up: bool = False

    @property
    def deaths(self) -> int:
        return len(self.restarts)


def parse_launcher_output(text: str) -> LauncherEvents:
    restarts, ready_again, failed, given_up = [], [], 0, False
    for line in text.splitlines():
        line = line.strip()
        if match := RESTARTING.match(line):
            restarts.append(match["reason"])
        elif match := READY_AGAIN.match(line):
            ready_again.append(float(match["seconds"]))
        elif line.startswith(RESTART_FAILED):
            failed += 1
        elif GIVING_UP.match(line):
            given_up = True
    return LauncherEvents(tuple(restarts), tuple(ready_again), failed, given_up)


@dataclass(frozen=True, slots=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls) -> Ports:
        from backends.serving.server_process import free_port

        return cls(free_port(), free_port(), free_port())


class LauncherServer:
    """One `python -m backends.serving.launcher` child; its output appended to `output`."""

    def __init__(self, profile: str, sets: list[str], log_dir: Path, name: str) -> None:
        self.ports = Ports.free()
        self.output = log_dir / f"{name}-launcher.out"
        self.triton_log = log_dir / f"{name}-triton.log"
        self._command = [sys.executable, "-m", "backends.serving.launcher", "--profile", profile,
                         "--http-port", str(self.ports.http), "--grpc-port", str(self.ports.grpc),
                         "--metrics-port", str(self.ports.metrics), "--log-file", str(self.triton_log),
                         *[arg for item in sets for arg in ("--set", item)]]
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False  # the last stop had to SIGKILL it
        self._offset = 0  # where this start's output begins in the (appended) file

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}"

    def start(self, timeout_s: float, abort: Callable[[], bool] = lambda: False) -> bool:
        """Start and wait for its ready line; False when `abort()` turned true first. Raises
        RuntimeError when the launcher exits first, TimeoutError after `timeout_s`."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._offset = self.output.stat().st_size if self.output.exists() else 0
        with open(self.output, "ab") as out:
            self.process = subprocess.Popen(self._command, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.text():
            if self.process.poll() is not None:
                raise RuntimeError(f"the launcher exited with {self.process.returncode}: {self.tail()}")
            if abort():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"no ready line within {timeout_s:.0f} s: {self.tail()}")
            time.sleep(0.5)
        return True

    def text(self) -> str:
        """This start's launcher output so far."""
        try:
            with open(self.output, "rb") as out:
                out.seek(self._offset)
                return out.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, num_chars: int = 1500) -> str:
        return self.text()[-num_chars:]

    def events(self) -> LauncherEvents:
        return parse_launcher_output(self.text())

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def tritonserver_pid(self) -> int | None:
        """The tritonserver the launcher runs now (a new pid after each restart)."""
        if self.process is None:
            return None
        pids = children_named(self.process.pid, "tritonserver")
        return pids[0] if pids else None

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGINT (the launcher stops its server gracefully), SIGKILL after `timeout_s`."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        self.killed = False
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                server = children_named(proc.pid, "tritonserver")
                proc.kill()
                proc.wait()
                for pid in server:  # its own process group (with its stubs): not orphaned
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
        return proc.returncode
