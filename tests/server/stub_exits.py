"""How a server's Python stub processes ended: their pids while the server runs, and the
kernel's segfault lines for them after it stopped (where the kernel log can be read)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def stub_pids(server_pid: int) -> list[int]:
    """The stub processes of one tritonserver: its children named like the stub binary."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            name, ppid = fields[0].split("(", 1)[1], int(fields[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and name.startswith("triton_python"):
            pids.append(int(stat.parent.name))
    return sorted(pids)


def kernel_log() -> str | None:
    """The kernel ring buffer, or None where this process may not read it."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout else None


def segfaults(log: str, pids: list[int]) -> list[str]:
    """The kernel's segfault lines of these stub pids."""
    marks = tuple(f"[{pid}]: segfault" for pid in pids)
    return [line for line in log.splitlines() if any(mark in line for mark in marks)]
