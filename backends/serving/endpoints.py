"""Where a running launcher's server answers, in a file: `<workdir>/endpoints.json`.

The container's health check runs in the container without the launcher's command line, so
it cannot know `--http-port` or `--grpc-port`; the launcher writes the addresses it serves
once the server is ready and removes the file when it exits, and the probe
(`python -m backends.serving.health --endpoints FILE`) reads them there.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ENDPOINTS_FILE = "endpoints.json"
EVERY_INTERFACE = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class Endpoints:
    http: str  # host:port, reachable from the server's own host
    grpc: str

    @staticmethod
    def serving(address: str, http_port: int, grpc_port: int) -> "Endpoints":
        """A server bound to `address`, as seen from its host (loopback for every interface)."""
        host = "127.0.0.1" if address in EVERY_INTERFACE else address
        host = f"[{host}]" if ":" in host else host
        return Endpoints(f"{host}:{http_port}", f"{host}:{grpc_port}")

    def write(self, path: Path) -> Path:
        """Replace `path` at once (a probe never reads half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_text(json.dumps(asdict(self)) + "\n")
        os.replace(staging, path)
        return path

    @staticmethod
    def read(path: Path) -> "Endpoints":
        """The file's endpoints; ValueError says why there are none (no server started yet)."""
        try:
            data = json.loads(Path(path).read_text())
            return Endpoints(http=str(data["http"]), grpc=str(data["grpc"]))
        except FileNotFoundError:
            raise ValueError(f"{path} does not exist: no server is ready yet (the launcher writes it "
                             f"once its server is ready)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not an endpoints file ({exc})") from exc
