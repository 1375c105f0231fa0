"""The benchmark's command line: either address form, and the server's files under --workdir."""
from __future__ import annotations

import contextlib

import pytest

from backends.serving import server_process
from perf import duplex_bench


def test_addresses_take_either_form():
    args = duplex_bench.build_parser().parse_args(
        ["--url", "http://a:8001,b:9001", "--metrics-url", "a:8002,http://b:9002/metrics"])
    duplex_bench.normalize_urls(args)
    assert args.url == "a:8001,b:9001"
    assert args.metrics_url == "http://a:8002/metrics,http://b:9002/metrics"


def test_a_malformed_address_exits_2(capsys):
    assert duplex_bench.main(["--url", "a"]) == 2
    assert "host:port" in capsys.readouterr().err


class RecordingServer:
    """Stands in for ServerProcess: records its options, starts nothing."""

    made: list[server_process.ServerOptions] = []

    def __init__(self, options: server_process.ServerOptions) -> None:
        RecordingServer.made.append(options)
        self.options = options
        self.grpc_url, self.metrics_port, self.log_file = "127.0.0.1:1", 2, options.workdir / "log"

    def __enter__(self) -> "RecordingServer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("extra, expected", [([], duplex_bench.DEFAULT_WORKDIR), (["--workdir", "W"], "W")])
def test_the_started_server_works_under_workdir(monkeypatch, tmp_path, extra, expected):
    monkeypatch.setattr(server_process, "ServerProcess", RecordingServer)
    RecordingServer.made = []
    args = duplex_bench.build_parser().parse_args(
        [arg if arg != "W" else str(tmp_path / "w") for arg in extra])
    with contextlib.ExitStack() as stack:
        url, _metrics = stack.enter_context(duplex_bench._server(args, 1))
    assert url == "127.0.0.1:1"
    want = tmp_path / "w" if expected == "W" else expected
    assert [options.workdir for options in RecordingServer.made] == [want]
    assert duplex_bench.DEFAULT_WORKDIR == server_process.DEFAULT_WORKDIR, "the default is the launcher's"
