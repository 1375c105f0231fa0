"""A second server on the same machine, started and stopped over and over during the soak.

Each cycle starts a `minicpmo-server` on other free ports with its own log, waits for it to be
ready, keeps it up for half the period, stops it with SIGINT and waits for its exit; the next
cycle starts one period after the previous one began. The soaked server must not notice
(shared CPU, /dev/shm, the workdir), and the neighbour itself must start and stop cleanly
every time: an exit code other than 0, a kill after the stop timeout or a restart of its own
is a failure.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from perf.soak_launcher import LauncherServer

READY_TIMEOUT_S = 300.0


@dataclass
class NeighbourTally:
    cycles: int = 0  # complete cycles: started, ready, stopped
    failures: list[str] = field(default_factory=list)
    running: bool = False  # a launcher of the neighbour is alive (starting, up or stopping)
    ran: bool = False  # running at some moment since the last `ran_since_last_look`
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_running(self, running: bool) -> None:
        with self.lock:
            self.running = running
            self.ran = self.ran or running

    def ran_since_last_look(self) -> bool:
        with self.lock:
            ran, self.ran = self.ran, self.running
        return ran

    def to_json(self) -> dict[str, object]:
        return {"cycles": self.cycles, "failures": list(self.failures)}


class Neighbour:
    def __init__(self, every_s: float, profile: str, log_dir: Path) -> None:
        if every_s <= 0:
            raise ValueError(f"the neighbour's period must be positive, got {every_s}")
        self._every_s, self._profile, self._log_dir = every_s, profile, log_dir
        self.tally = NeighbourTally()

    def run(self, stop: threading.Event) -> None:
        """Cycle until `stop` is set; a cycle under way when it is set ends with a stop."""
        while not stop.is_set():
            began = time.monotonic()
            self._cycle(stop)
            stop.wait(max(0.0, self._every_s - (time.monotonic() - began)))

    def _cycle(self, stop: threading.Event) -> None:
        server = LauncherServer(self._profile, [], self._log_dir, "neighbour")
        self.tally.set_running(True)
        try:
            if server.start(READY_TIMEOUT_S, abort=stop.is_set):
                stop.wait(self._every_s / 2)
                self._stopped(server, server.stop())
        except (RuntimeError, TimeoutError, OSError) as err:
            self.tally.failures.append(f"start: {str(err).splitlines()[0]}")
        finally:
            server.stop()  # a no-op after a stop
            self.tally.set_running(False)

    def _stopped(self, server: LauncherServer, code: int | None) -> None:
        events = server.events()
        if code != 0 or server.killed or events.deaths:
            self.tally.failures.append(f"cycle {self.tally.cycles + 1}: exit {code}, killed {server.killed}, "
                                       f"restarts {list(events.restarts)}")
        self.tally.cycles += 1
