"""`duplex` finds its own server's gRPC address on the server's command line (own_server.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.serving.grpc_stages import stage_url
from backends.serving.server_process import server_environment
from backends.serving.own_server import OwnServerNotFound, ServerCommandLine, own_server_grpc_url


def fake_proc(root: Path, processes: dict[int, tuple[int, list[str]]]) -> Path:
    """A /proc with `pid: (parent pid, argv)` entries; names with spaces and parentheses, as
    /proc/PID/stat can hold."""
    for pid, (parent, argv) in processes.items():
        folder = root / str(pid)
        folder.mkdir(parents=True)
        (folder / "stat").write_text(f"{pid} (a name) (x) S {parent} {pid} {pid} 0 -1\n")
        (folder / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
    return root


STUB = ["/opt/tritonserver/backends/python/triton_python_backend_stub", "/models/duplex/1/model.py"]


@pytest.mark.parametrize("server_argv, url", [
    (["tritonserver", "--model-repository=/models"], "127.0.0.1:8001"),
    (["/opt/tritonserver/bin/tritonserver", "--model-repository", "/m", "--grpc-port=9101"], "127.0.0.1:9101"),
    (["tritonserver", "--model-store=/m", "--grpc-port", "9", "--grpc-port=9102"], "127.0.0.1:9102"),
    (["tritonserver", "--model-repository=/m", "--grpc-address=127.0.0.2", "--grpc-port=9103"], "127.0.0.2:9103"),
    (["tritonserver", "--model-repository=/m", "--grpc-address=::", "--grpc-port=9104"], "127.0.0.1:9104"),
    (["tritonserver", "--model-repository=/m", "--grpc-address=::1", "--grpc-port=9105"], "[::1]:9105"),
    (["/usr/bin/python3", "wrapper", "--model-repository=/m", "--grpc-port=9106"], "127.0.0.1:9106"),
])
def test_the_address_comes_from_the_server_above_the_stub(tmp_path, server_argv, url):
    proc = fake_proc(tmp_path, {
        1: (0, ["/sbin/init"]),
        40: (1, server_argv),
        41: (40, ["bash", "-c", "exec stub"]),  # the backend may start the stub through a shell
        42: (41, STUB),
    })
    assert own_server_grpc_url(42, proc) == url


def test_no_server_above_says_so(tmp_path):
    proc = fake_proc(tmp_path, {1: (0, ["/sbin/init"]), 7: (1, ["python", "-m", "pytest"]), 8: (7, STUB)})
    with pytest.raises(OwnServerNotFound, match="no tritonserver among the ancestors of process 8"):
        own_server_grpc_url(8, proc)


def test_a_server_without_grpc_says_so():
    with pytest.raises(OwnServerNotFound, match="--allow-grpc=false"):
        ServerCommandLine(("tritonserver", "--model-repository=/m", "--allow-grpc=false")).grpc_url()
    with pytest.raises(OwnServerNotFound, match="not a port number"):
        ServerCommandLine(("tritonserver", "--model-repository=/m", "--grpc-port=x")).grpc_url()


def test_an_unreadable_process_tree_says_so(tmp_path):
    with pytest.raises(OwnServerNotFound, match="cannot read the process tree"):
        own_server_grpc_url(5, tmp_path)


def test_stage_url_takes_the_parameter_then_the_environment_then_the_server(monkeypatch):
    monkeypatch.setenv("MINICPMO_STAGE_URL", "127.0.0.1:9")
    assert stage_url({}) == "127.0.0.1:9" and stage_url({"stage_url": "h:1"}) == "h:1"
    monkeypatch.delenv("MINICPMO_STAGE_URL")
    # This test process runs under no tritonserver: the load error names both settings.
    with pytest.raises(ValueError, match="MINICPMO_STAGE_URL=HOST:PORT.*`stage_url` parameter"):
        stage_url({}, pid=os.getpid())


def test_the_launcher_leaves_no_stage_address_in_the_server_environment():
    assert server_environment({"PATH": "/bin", "MINICPMO_STAGE_URL": "elsewhere:1"}) == {"PATH": "/bin"}
