"""CUDA MPS for the stage processes that share a GPU.

Every Triton Python-backend model instance is its own process with its own CUDA context. Without
MPS the GPU time-slices between those contexts, so a Thinker decode step waits behind a Code2Wav
window of another process even though the two would fit on the GPU together (on an H200, an
in-process Thinker unit at one session took 27 ms alone, 56 ms beside a busy Code2Wav process, 38
ms with MPS). An MPS control daemon lets the kernels of all stage processes run concurrently.

The launcher starts a private daemon per server (its own pipe directory, so nothing else on the
machine attaches to it; its log beside the server's) before tritonserver,
hands its pipe directory to the server's environment and quits it after the server exits.
Modes: `off`; `on` (fail if the daemon cannot start); `auto` (on for GPU profiles when the
daemon binary is found and no MPS runs already: none named by the environment, no host-wide
daemon at the default pipe; else off, with a log line).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODES = ("auto", "on", "off")
CONTROL_BINARY = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
# A host-wide daemon listens here; CUDA clients without PIPE_ENV attach to it on their own.
DEFAULT_PIPE = Path("/tmp/nvidia-mps")
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class MpsDaemon:
    """One private MPS control daemon; `environment()` is what its clients need. The pipe
    directory is a fresh temporary one (its socket path must stay short), removed on stop."""

    log_dir: Path
    binary: str
    pipe_dir: Path | None = None
    started: bool = False

    def environment(self) -> dict[str, str]:
        return {PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}

    def start(self, timeout_s: float = 20.0) -> None:
        self.pipe_dir = Path(tempfile.mkdtemp(prefix="minicpmo-mps-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:  # -d daemonizes: the call returns once the control daemon listens on the pipe
            result = subprocess.run([self.binary, "-d"], env={**os.environ, **self.environment()},
                                    capture_output=True, timeout=timeout_s, check=False)
            if result.returncode != 0:
                output = (result.stderr or result.stdout).decode(errors="replace").strip()
                raise RuntimeError(f"{self.binary} -d failed ({result.returncode}): {output}")
        except BaseException:
            shutil.rmtree(self.pipe_dir, ignore_errors=True)
            raise
        self.started = True

    def stop(self, timeout_s: float = 20.0) -> None:
        """Quit the daemon (and its server); idempotent, never raises: called on every path."""
        if not self.started:
            return
        self.started = False
        try:
            subprocess.run([self.binary], input=b"quit\n", env={**os.environ, **self.environment()},
                           capture_output=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            logger.warning("stopping the MPS daemon at %s failed: %s", self.pipe_dir, err)
        if self.pipe_dir is not None:
            shutil.rmtree(self.pipe_dir, ignore_errors=True)


def mps_daemon(mode: str, device: str, log_dir: Path) -> MpsDaemon | None:
    """The daemon to start for a server on `device`, or None (mode off, CPU, or `auto` without
    the binary or with MPS already configured by the environment)."""
    if mode not in MODES:
        raise ValueError(f"mps must be one of {MODES}, got {mode!r}")
    if mode == "off" or (mode == "auto" and device != "cuda"):
        return None
    binary = shutil.which(CONTROL_BINARY)
    configured = PIPE_ENV in os.environ or (DEFAULT_PIPE / "control").exists()
    if mode == "auto" and (binary is None or configured):
        reason = "MPS is configured already" if binary else f"{CONTROL_BINARY} not found"
        logger.info("MPS off (%s): the stage processes time-slice the GPU", reason)
        return None
    if binary is None:
        raise RuntimeError(f"--mps on: {CONTROL_BINARY} not found on PATH")
    return MpsDaemon(log_dir, binary)
