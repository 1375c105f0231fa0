"""What a running server holds, read from outside: the resource gauges on its metrics port, the
shared-memory segments its processes map, and its stub processes.

`ServerResources.take(server)` is one snapshot; `settled(server, baseline)` polls until the
gauges are back at a baseline (they are published asynchronously: a stage after each engine
round, the orchestrator every reaper period) and returns the last snapshot either way.
`warm_baseline(server)` runs one short conversation first: a stage publishes its gauges only
once it has handled a request, and the first session may grow the shared-memory pools; the
baseline is taken once every count that is zero on an idle server is zero (sessions, their
threads, stage requests, codec state, the orchestrator's pooled stage streams) and two looks a
reaper period apart agree.
`orphan_segments(before)` lists the files that appeared in /dev/shm since `dev_shm()` was
taken and that no process maps: segments somebody created and never unlinked (other servers
on the machine may come and go meanwhile; theirs are mapped while they live).
"""
from __future__ import annotations

import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from session_probe import SessionProbe, silence_units

from backends.serving.resource_gauges import parse_gauges

# The counts that must return to their idle values after any mix of sessions. The orchestrator's
# session threads included (two per session): a session whose loops never exit shows up here;
# and all of its threads (a stage call's stream that leaves a thread behind: client/stream_close.py;
# the pooled channels' streams, which close after a few idle seconds: backends/serving/grpc_stages.py).
TRACKED = (
    ("sessions", "duplex"), ("session_threads", "duplex"), ("threads", "duplex"), ("uplink_audio_ms", "duplex"),
    ("stage_idle_streams", "duplex"), ("stage_draining_streams", "duplex"),
    ("requests", "thinker"), ("runner_requests", "thinker"), ("kv_free_blocks", "thinker"),
    ("requests", "talker"), ("runner_requests", "talker"), ("kv_free_blocks", "talker"),
    ("requests", "code2wav"), ("codec_states", "code2wav"), ("codec_sequences", "code2wav"),
    ("codec_pending", "code2wav"), ("voice_users", "code2wav"),
)
# The tracked counts that are zero on an idle server (the others: process threads, free KV blocks).
ZERO_WHEN_IDLE = tuple(key for key in TRACKED if key[0] not in ("threads", "kv_free_blocks"))
SETTLE_TIMEOUT_S = 60.0  # a bound for gauges on their way back, not a timing: a leak never settles
STABLE_GAP_S = 0.6  # longer than the orchestrator's reaper period (0.5 s) between two looks


@dataclass(frozen=True)
class ServerResources:
    gauges: dict[tuple[str, str], float]
    shm: dict[str, int]  # /dev/shm path mapped by a server process -> size in bytes
    stubs: frozenset[int]  # pids of the server's stub processes (a crashed stub is restarted or gone)

    @staticmethod
    def take(server) -> "ServerResources":
        pids = _process_tree(server.process.pid)
        return ServerResources(_gauges(server), _shm_segments(pids), frozenset(pids - {server.process.pid}))

    def tracked(self) -> dict[tuple[str, str], float | None]:
        return {key: self.gauges.get(key) for key in TRACKED}

    @property
    def stranded(self) -> float:
        """Threads of sessions the reaper force-finished that are still blocked in a stage call."""
        return self.gauges.get(("stranded_threads", "duplex"), 0.0)


def warm_baseline(server) -> ServerResources:
    """One short conversation through all three stages, then the idle snapshot."""
    probe = SessionProbe(server.grpc_url)
    probe.start(initial_user_text="hi", reply_units=1, reply_tokens_per_unit=2)
    probe.append(silence_units(2))
    probe.wait_type("response.done")
    probe.close()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    previous = ServerResources.take(server)
    while True:
        time.sleep(STABLE_GAP_S)
        now = ServerResources.take(server)
        tracked = now.tracked()
        idle = None not in tracked.values() and all(tracked[key] == 0 for key in ZERO_WHEN_IDLE)
        if (idle and tracked == previous.tracked()) or time.monotonic() > deadline:
            return now
        previous = now


def settled(server, baseline: ServerResources, timeout_s: float = SETTLE_TIMEOUT_S) -> ServerResources:
    """Poll until every tracked gauge equals `baseline`; the last snapshot either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = ServerResources.take(server)
        if now.tracked() == baseline.tracked() or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


def wait_for_gauges(server, expected: dict[tuple[str, str], float], timeout_s: float = SETTLE_TIMEOUT_S) -> dict:
    """Poll until the gauges named in `expected` have those values; the last values either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        gauges = _gauges(server)
        current = {key: gauges.get(key) for key in expected}
        if current == expected or time.monotonic() > deadline:
            return current
        time.sleep(0.1)


def _gauges(server) -> dict[tuple[str, str], float]:
    url = f"http://{server.options.address}:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_gauges(response.read().decode())


def _process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):  # the process just exited
                continue
            if state != "Z":  # a crashed stub its server has not reaped yet counts as gone
                children.setdefault(int(ppid), []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def dev_shm() -> set[str]:
    return {str(path) for path in Path("/dev/shm").iterdir()}


def orphan_segments(before: set[str], confirm_s: float = 2.0) -> list[str]:
    """New unmapped files, still there and unmapped `confirm_s` later (a server that is
    stopping unmaps its regions a moment before it unlinks them)."""
    first = _unmapped(dev_shm() - before)
    if first:
        time.sleep(confirm_s)
    return sorted(_unmapped(first))


def _unmapped(paths: set[str]) -> set[str]:
    mapped = _mapped_paths({int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()})
    return {path for path in paths if path not in mapped and os.path.exists(path)}


def _mapped_paths(pids: set[int]) -> set[str]:
    paths = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        paths.update(line.split(None, 5)[5] for line in maps.splitlines()
                     if "/dev/shm/" in line and len(line.split(None, 5)) == 6)
    return paths


def _shm_segments(pids: set[int]) -> dict[str, int]:
    paths = _mapped_paths(pids)
    return {path: os.stat(path).st_size for path in paths if os.path.exists(path)}
