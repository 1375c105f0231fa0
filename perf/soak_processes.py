"""The server's processes as the soak watches them (Linux /proc): the memory of a process tree,
the tritonserver a launcher runs, its Python stub processes, and the kernel's segfault lines.

Triton 2.51 never restarts a stub that died while its model stays loaded, and the launcher's
supervisor restarts the whole server when one did (readiness fails): a stub pid that leaves
the set under the same tritonserver is a stub death, a new tritonserver pid is a server restart.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

STUB_PREFIX = "triton_python"  # the stub binary's name, cut to 15 characters by the kernel


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    name: str


def processes() -> list[Proc]:
    """Every process this user can see, from /proc/<pid>/stat."""
    procs = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
            procs.append(Proc(int(stat.parent.name), int(tail.split()[1]), head.split("(", 1)[1]))
        except (OSError, IndexError, ValueError):
            continue
    return procs


def children_named(parent: int, prefix: str, procs: list[Proc] | None = None) -> list[int]:
    """Pids of the children of `parent` whose name starts with `prefix`, sorted."""
    return sorted(p.pid for p in (processes() if procs is None else procs)
                  if p.ppid == parent and p.name.startswith(prefix))


def stub_models(server_pid: int) -> dict[int, str]:
    """The stub processes of one tritonserver: pid -> its model (a stub's first argument is
    <repository>/<model>/<version>/model.py)."""
    models = {}
    for pid in children_named(server_pid, STUB_PREFIX):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # the stub just exited
            continue
        if len(args) > 1:
            models[pid] = Path(args[1].decode(errors="replace")).parent.parent.name
    return models


def stub_of(server_pid: int, model: str) -> int:
    """The pid of `model`'s stub under this tritonserver; LookupError when it has none."""
    found = [pid for pid, name in stub_models(server_pid).items() if name == model]
    if not found:
        raise LookupError(f"no stub process of {model} under pid {server_pid}")
    return found[0]


def tree_rss_mb(root_pid: int) -> float:
    """Resident memory of `root_pid` and all its descendants, in MiB."""
    children: dict[int, list[int]] = {}
    for proc in processes():
        children.setdefault(proc.ppid, []).append(proc.pid)
    total_kb, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kb / 1024.0


@dataclass(frozen=True, slots=True)
class StubSnapshot:
    """The stub pids of one tritonserver at one moment (server_pid None: no server seen)."""

    server_pid: int | None
    stubs: frozenset[int]

    @classmethod
    def of(cls, server_pid: int | None) -> StubSnapshot:
        if server_pid is None:
            return cls(None, frozenset())
        return cls(server_pid, frozenset(children_named(server_pid, STUB_PREFIX)))


def stub_restarts(before: StubSnapshot, after: StubSnapshot) -> int:
    """Stubs that died or came anew between two snapshots of the same server: the larger of
    the pids gone and the pids new. Across a changed (or vanished) server pid the stubs all
    change with it: that is a server restart, counted from the launcher's output."""
    if before.server_pid is None or before.server_pid != after.server_pid:
        return 0
    return max(len(before.stubs - after.stubs), len(after.stubs - before.stubs))


def kernel_log() -> str | None:
    """The kernel ring buffer, or None where this process may not read it."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout else None


_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def segfaults(log: str, pids: set[int], since_s: float = 0.0) -> list[str]:
    """The kernel's segfault lines of these pids (`name[pid]: segfault at ...`) stamped at or
    after `since_s` (`time.monotonic()`, the clock of the kernel's stamps): the ring buffer
    also holds lines of earlier processes that had the same pids."""
    marks = tuple(f"[{pid}]: segfault" for pid in sorted(pids))
    return [line for line in log.splitlines()
            if any(mark in line for mark in marks) and _stamp(line) >= since_s]


def _stamp(line: str) -> float:
    found = _STAMP.match(line)
    return float(found.group(1)) if found else float("inf")  # unstamped (dmesg -t): kept
