"""A tritonserver child process on the repository rendered for a profile: start, readiness,
graceful stop; and the rendering alone for a plain tritonserver (`--render-only`).

Each start generates a new stage secret (backends/serving/stage_secret.py), written to a 0600
file under the workdir whose path the model processes get in MINICPMO_STAGE_SECRET_FILE: the
stage models serve only requests that carry it, which `duplex` sends and outside clients do not
have.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from backends.checkpoint.prepare import prepare_checkpoint
from backends.serving.endpoints import ENDPOINTS_FILE, Endpoints
from backends.serving.grpc_stages import STAGE_URL_ENV
from backends.serving.health import server_ready
from backends.serving.mps import MpsDaemon, mps_daemon
from backends.serving.profiles import Profile
from backends.serving.repository import render_repository
from backends.serving.stage_secret import SECRET_FILE_ENV, new_secret, write_secret_file
from backends.serving.supervisor import SupervisorPolicy
from backends.serving.triton_install import find_triton

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPOSITORY = PROJECT_ROOT / "model_repository"
DEFAULT_WORKDIR = PROJECT_ROOT / "var"
# Audio chunks and hidden states cross the shm region between each stub and the server.
SHM_ARGS = ("--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216")


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


@dataclass(slots=True)
class ServerOptions:
    profile: Profile
    repository: Path = DEFAULT_REPOSITORY
    workdir: Path = DEFAULT_WORKDIR
    address: str = "127.0.0.1"
    http_port: int = 0  # 0 = pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    log_file: Path | None = None
    ready_timeout_s: float = 300.0
    mps: str = "auto"  # CUDA MPS for the stage processes: auto | on | off (backends/serving/mps.py)
    extra_args: list[str] = field(default_factory=list)
    # Ready only once every stage answers its `health` action (backends/serving/health.py);
    # off for a repository without our stage models.
    stage_health: bool = True
    # `minicpmo-server` restarts a server that dies or stops answering (backends/serving/supervisor.py).
    supervisor: SupervisorPolicy = field(default_factory=SupervisorPolicy)


class ServerProcess:
    """One tritonserver child process; a context manager that always stops it."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        self.mps: MpsDaemon | None = None
        pick = lambda port: port or free_port(options.address)  # noqa: E731
        self.http_port, self.grpc_port = pick(options.http_port), pick(options.grpc_port)
        self.metrics_port = pick(options.metrics_port)
        self.log_file = options.log_file or options.workdir / "logs" / f"triton-{self.grpc_port}.log"
        # Stage requests must carry it (tools that call a stage directly take it from here).
        self.stage_secret = new_secret()
        self.stage_secret_file = options.workdir / "secrets" / f"stage-{self.grpc_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.address}:{self.grpc_port}"

    @property
    def stage_url(self) -> str:
        """Where `duplex` reaches the stages: this server's gRPC port, on loopback when it
        listens on every interface."""
        host = "127.0.0.1" if self.options.address in ("0.0.0.0", "::", "") else self.options.address
        return f"{host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.options.address}:{self.http_port}"

    def start(self) -> "ServerProcess":
        opts = self.options
        install = find_triton(opts.workdir / "triton")
        repo = render_for(opts, opts.workdir / "repos" / f"{opts.profile.name}-{self.grpc_port}")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            env = {**server_environment(install.environment()), **self._start_mps(), **self.write_stage_secret()}
            with open(self.log_file, "wb") as log:
                self.process = subprocess.Popen(
                    self._command(install.binary, install.backend_dir, repo), stdout=log,
                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def write_stage_secret(self) -> dict[str, str]:
        """Write this start's stage secret (0600; removed by `stop`); the environment entry
        that hands its path to the model processes."""
        write_secret_file(self.stage_secret_file, self.stage_secret)
        return {SECRET_FILE_ENV: str(self.stage_secret_file)}

    def _start_mps(self) -> dict[str, str]:
        """Start this server's MPS daemon if its mode asks for one; `auto` falls back to
        time-slicing (with a warning) when the daemon does not start."""
        log_dir = self.log_file.parent / f"mps-{self.grpc_port}"
        daemon = mps_daemon(self.options.mps, self.options.profile.device, log_dir)
        if daemon is None:
            return {}
        try:
            daemon.start()
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
            if self.options.mps == "on":
                raise
            print(f"MPS not started ({err}); the stage processes time-slice the GPU", file=sys.stderr)
            return {}
        self.mps = daemon
        print(f"MPS daemon started for the stage processes (pipe {daemon.pipe_dir})", file=sys.stderr)
        return daemon.environment()

    def _command(self, binary: Path, backend_dir: Path, repo: Path) -> list[str]:
        opts = self.options
        return [
            str(binary), f"--model-repository={repo}", f"--backend-directory={backend_dir}",
            f"--http-address={opts.address}", f"--grpc-address={opts.address}",
            f"--metrics-address={opts.address}", f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=20", "--log-verbose=0", *SHM_ARGS, *opts.extra_args,
        ]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}; log: {self.log_file}\n"
                                   + self.log_tail())
            if self.is_ready():
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {self.options.ready_timeout_s:.0f} s; log: {self.log_file}\n"
                           + self.log_tail())

    def is_ready(self) -> bool:
        """Every model loaded (Triton's strict readiness) and, unless the options turn it off,
        every stage able to serve, asked over the path `duplex` uses (backends/serving/health.py)."""
        return server_ready(self.http_url, self.stage_url, check_stages=self.options.stage_health, timeout_s=5)

    def exited(self) -> str | None:
        """None while the server process runs; otherwise how it ended."""
        if self.process is None:
            return "is not running"
        code = self.process.poll()
        if code is None:
            return None
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def log_tail(self, num_bytes: int = 4000) -> str:
        try:
            return self.log_file.read_bytes()[-num_bytes:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGINT (graceful: finalize every model), then SIGKILL the group if it hangs."""
        proc, self.process = self.process, None
        try:
            if proc is None:
                return None
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            return proc.returncode
        finally:
            if proc is not None:
                kill_leftovers(proc.pid)
            if self.mps is not None:  # after its clients (the stage processes) are gone
                self.mps.stop()
                self.mps = None
            self.stage_secret_file.unlink(missing_ok=True)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_leftovers(group: int) -> None:
    """SIGKILL what is left of a server's process group once the server has exited. After a
    death its Python stubs notice and call exit(), which can deadlock in a stub whose threads
    are inside gRPC: a killed server's `duplex` stub stayed for good, holding ~250 MB. The group
    is the server's own (`start_new_session`), so it holds nothing else; after a clean stop it
    is already empty."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def render_for(options: ServerOptions, dest: Path) -> Path:
    """The repository rendered for the options' profile into `dest`, with its checkpoint
    prepared under the workdir (the tiny one is generated on first use)."""
    checkpoint = prepare_checkpoint(options.profile.checkpoint, options.workdir / "checkpoints")
    profile = options.profile.with_overrides({"checkpoint": str(checkpoint)}) if checkpoint else options.profile
    return render_repository(options.repository, dest, profile)


def plain_command(options: ServerOptions, repo: Path) -> str:
    """The shell line that starts a plain tritonserver on `repo` as the launcher would (without
    supervision or a stage secret), the stub for this Python prepared under the workdir."""
    install = find_triton(options.workdir / "triton")
    libs = ":".join(str(path) for path in install.library_dirs)
    args = [str(install.binary), f"--model-repository={repo}", f"--backend-directory={install.backend_dir}",
            f"--grpc-port={options.grpc_port}", f"--http-port={options.http_port}",
            f"--metrics-port={options.metrics_port}", *SHM_ARGS]
    path = f"{Path(sys.executable).parent}:$PATH"
    return f'LD_LIBRARY_PATH={shlex.quote(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} PATH="{path}" ' \
        + shlex.join(args)


def render_only(options: ServerOptions, dest: Path) -> int:
    """`--render-only DIR`: write the rendering for any profile (a GPU one too: nothing is
    loaded here) and print how to start a plain tritonserver on it."""
    repo = render_for(options, dest.resolve())
    print(f"rendered profile {options.profile.name} into {repo}")
    try:
        print("start it here with:\n  " + plain_command(options, repo))
    except RuntimeError as err:  # no tritonserver here: the rendering is still usable elsewhere
        print(f"no tritonserver here to start it with ({err}); in the NGC container:\n  "
              + shlex.join(["tritonserver", f"--model-repository={repo}", *SHM_ARGS]))
    return 0


def server_environment(base: dict[str, str]) -> dict[str, str]:
    """`base` without a stage address: `duplex` reads its server's gRPC port from the server's
    command line (backends/serving/own_server.py), as under a plain tritonserver, so a
    MINICPMO_STAGE_URL left in the shell cannot point it at another server."""
    return {key: value for key, value in base.items() if key != STAGE_URL_ENV}


def write_endpoints(server: ServerProcess) -> Path:
    """`<workdir>/endpoints.json`: where the health check finds this server (backends/serving/endpoints.py)."""
    opts = server.options
    return Endpoints.serving(opts.address, server.http_port, server.grpc_port).write(opts.workdir / ENDPOINTS_FILE)
