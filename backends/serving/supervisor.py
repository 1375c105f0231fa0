"""Keep one tritonserver serving: restart it when it dies or stops answering.

Triton 2.51 has defects no model code can rule out (docs/triton_behaviours.md, "Server
deaths"): the server process can abort, and a stub process that dies is never restarted while
its model stays loaded. `minicpmo-server` therefore supervises its server. Every
`probe_interval_s` it checks that the process lives and that every model answers its
readiness probe (backends/serving/health.py); after the process exits, or after
`unhealthy_after` failed probes in a row, it saves the old log beside the new one and starts
the server again on the same ports with the same options. Clients whose stream broke get
`server_restarting` from the client library and open a new session once it is ready.

A server that keeps dying is not restarted for ever: after `max_restarts` within
`restart_window_s` the supervisor gives up and exits non-zero, so the orchestrator above it
(systemd, Kubernetes) sees a failed service instead of a flapping one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol


class Supervised(Protocol):
    """What the supervisor needs of a server (backends/serving/launcher.py's ServerProcess)."""

    log_file: Path

    def start(self) -> object: ...

    def stop(self, timeout_s: float = 30.0) -> int | None: ...

    def exited(self) -> str | None: ...

    def is_ready(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SupervisorPolicy:
    probe_interval_s: float = 2.0
    # Failed readiness probes in a row before a restart: ~10 s and more (each probe may wait
    # 5 s), so a server that is only busy is left alone.
    unhealthy_after: int = 5
    max_restarts: int = 5
    restart_window_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Restart:
    reason: str
    at_s: float  # monotonic clock
    ready_after_s: float | None  # None: the new server did not come up


class Supervisor:
    def __init__(self, server: Supervised, policy: SupervisorPolicy = SupervisorPolicy(),
                 say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._server, self._policy, self._say = server, policy, say
        self._clock, self._sleep = clock, sleep
        self.restarts: list[Restart] = []

    def run(self, stop_requested: Callable[[], bool]) -> int:
        """Supervise until a stop is asked for (exit 0) or the restart budget is spent (1)."""
        failed_probes = 0
        while not stop_requested():
            self._sleep(self._policy.probe_interval_s)
            if stop_requested():
                break
            reason = self._server.exited()
            if reason is None:
                if self._server.is_ready():
                    failed_probes = 0
                    continue
                failed_probes += 1
                if failed_probes < self._policy.unhealthy_after:
                    continue
                reason = f"failed {failed_probes} readiness probes in a row"
            if not self._may_restart():
                self._say(f"tritonserver {reason}; {len(self.restarts)} restarts in the last "
                          f"{self._policy.restart_window_s:.0f} s: giving up")
                self._server.stop()
                return 1
            self._restart(reason)
            failed_probes = 0
        return 0

    def _may_restart(self) -> bool:
        since = self._clock() - self._policy.restart_window_s
        return sum(r.at_s >= since for r in self.restarts) < self._policy.max_restarts

    def _restart(self, reason: str) -> None:
        began = self._clock()
        self._say(f"tritonserver {reason}: restarting (previous log kept as {keep_log(self._server.log_file)})")
        self._server.stop()
        try:
            self._server.start()
        except (RuntimeError, TimeoutError, OSError) as err:  # counted; the next round tries again
            self.restarts.append(Restart(reason, began, None))
            self._say(f"tritonserver restart failed: {str(err).splitlines()[0]}")
            return
        restart = Restart(reason, began, self._clock() - began)
        self.restarts.append(restart)
        self._say(f"tritonserver ready again after {restart.ready_after_s:.1f} s")


def keep_log(log_file: Path) -> Path:
    """Move the log of the server that died aside (one previous log kept), for its stacks."""
    previous = log_file.with_name(log_file.name + ".previous")
    if log_file.exists():
        log_file.replace(previous)
    return previous


__all__ = ["Supervisor", "SupervisorPolicy", "Restart", "keep_log"]
