"""Peak GPU memory while a level runs, sampled with `nvidia-smi` (all processes on the GPUs).

The stage processes are Triton's, not ours, so their torch allocator statistics are out of
reach; the driver's `memory.used` covers them all (weights, KV caches, allocator caches and
CUDA contexts). Sampling every `period_s` can miss a spike shorter than the period. Without
`nvidia-smi` (CPU runs) the sampler reports None.
"""
from __future__ import annotations

import shutil
import subprocess
import threading

QUERY = ["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]


def read_memory_mib() -> dict[int, tuple[float, float]] | None:
    """{gpu index: (used MiB, total MiB)}, or None without a working nvidia-smi."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    readings = {}
    for line in out.strip().splitlines():
        index, used, total = (part.strip() for part in line.split(","))
        readings[int(index)] = (float(used), float(total))
    return readings or None


class GpuMemorySampler:
    """Context manager: samples in a background thread; `peak_mib` per GPU afterwards."""

    def __init__(self, period_s: float = 0.5) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self.peak_mib: dict[int, float] | None = None
        self.total_mib: dict[int, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-memory", daemon=True)

    def __enter__(self) -> "GpuMemorySampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        readings = read_memory_mib()
        if readings is None:
            return
        peak = dict(self.peak_mib or {})
        for index, (used, _) in readings.items():
            peak[index] = max(peak.get(index, 0.0), used)
        self.peak_mib = peak
        self.total_mib = {index: total for index, (_, total) in readings.items()}
