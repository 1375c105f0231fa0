"""The gRPC address of the tritonserver that runs this model process, read from its command line.

`duplex` calls the stages over gRPC on its own server (backends/serving/grpc_stages.py). Under
plain `tritonserver --model-repository=... --grpc-port=N` nobody tells the model N, so the
model walks up its process ancestors (stub, maybe a shell, the server) to the first process
whose command line is a tritonserver's and reads `--grpc-port` and `--grpc-address` there,
with Triton's own defaults (8001, every interface) for a flag that is absent. Linux only
(/proc), as Triton is.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TRITON_DEFAULT_GRPC_PORT = 8001
EVERY_INTERFACE = ("0.0.0.0", "::", "")
# A tritonserver's command line names its repository with one of these.
REPOSITORY_FLAGS = ("--model-repository", "--model-store")
MAX_ANCESTORS = 16


class OwnServerNotFound(LookupError):
    """No tritonserver among the ancestors, or one without gRPC; the message says why."""


@dataclass(frozen=True, slots=True)
class ServerCommandLine:
    argv: tuple[str, ...]

    def flag(self, name: str) -> str | None:
        """The last value of `--name=V` or `--name V` (Triton takes the last one), else None."""
        value = None
        for index, arg in enumerate(self.argv):
            if arg.startswith(f"{name}="):
                value = arg.split("=", 1)[1]
            elif arg == name and index + 1 < len(self.argv):
                value = self.argv[index + 1]
        return value

    @property
    def is_tritonserver(self) -> bool:
        if self.argv and Path(self.argv[0]).name == "tritonserver":
            return True
        return any(arg.split("=", 1)[0] in REPOSITORY_FLAGS for arg in self.argv[1:])

    def grpc_url(self) -> str:
        """`host:port` where this server's gRPC endpoint answers a process on the same host."""
        if (self.flag("--allow-grpc") or "true").lower() in ("false", "0", "no", "off"):
            raise OwnServerNotFound("the server runs with --allow-grpc=false, and duplex calls the stages "
                                    "over gRPC")
        port_text = self.flag("--grpc-port") or str(TRITON_DEFAULT_GRPC_PORT)
        if not port_text.isdigit():
            raise OwnServerNotFound(f"the server's --grpc-port is {port_text!r}, not a port number")
        host = self.flag("--grpc-address") or "0.0.0.0"
        host = "127.0.0.1" if host in EVERY_INTERFACE else host
        return f"[{host}]:{port_text}" if ":" in host else f"{host}:{port_text}"


def parent_pid(pid: int, proc: Path) -> int:
    """The parent of `pid` from /proc/PID/stat (the fields after the parenthesized name)."""
    stat = (proc / str(pid) / "stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def command_line(pid: int, proc: Path) -> tuple[str, ...]:
    raw = (proc / str(pid) / "cmdline").read_bytes()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def ancestors(pid: int, proc: Path) -> Sequence[int]:
    """The parent of `pid`, its parent, ... up to (not including) pid 0, at most MAX_ANCESTORS."""
    found: list[int] = []
    current = pid
    while len(found) < MAX_ANCESTORS:
        current = parent_pid(current, proc)
        if current <= 0:
            break
        found.append(current)
    return found


def own_server_grpc_url(pid: int, proc: Path = Path("/proc")) -> str:
    """The gRPC `host:port` of the tritonserver above process `pid`; OwnServerNotFound says why not."""
    try:
        for ancestor in ancestors(pid, proc):
            server = ServerCommandLine(command_line(ancestor, proc))
            if server.is_tritonserver:
                return server.grpc_url()
    except (OSError, ValueError, IndexError) as exc:  # no /proc, or a process gone meanwhile
        raise OwnServerNotFound(f"cannot read the process tree ({exc})") from exc
    raise OwnServerNotFound(f"no tritonserver among the ancestors of process {pid}")
