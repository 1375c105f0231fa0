"""How a server's Python stub processes ended: their pids while the server runs, and the
kernel's segfault lines for them after it stopped (where the kernel log can be read). The
/proc and kernel-log readers are the soak's (perf/soak_processes.py)."""
from __future__ import annotations

from perf.soak_processes import STUB_PREFIX, children_named, kernel_log, segfaults

__all__ = ["kernel_log", "segfaults", "stub_pids"]


def stub_pids(server_pid: int) -> list[int]:
    """The stub processes of one tritonserver: its children named like the stub binary."""
    return children_named(server_pid, STUB_PREFIX)
