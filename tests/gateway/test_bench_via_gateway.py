"""`perf.duplex_bench --via gateway`: one run measures the same turns direct over gRPC and
through a gateway it starts, and reports both."""
from __future__ import annotations

import json

import pytest

from perf import duplex_bench

pytestmark = pytest.mark.server


def test_bench_runs_direct_and_via_gateway(server, tmp_path, capsys):
    code = duplex_bench.main(["--url", server.grpc_url, "--concurrency", "1", "--num-groups", "1",
                              "--turns-per-group", "1", "--warmup-turns", "0", "--reply-units-min", "2",
                              "--reply-units-max", "2", "--via", "gateway", "--out", str(tmp_path)])
    assert code == 0
    for name in ("duplex", "duplex-gateway"):
        summary = json.loads((tmp_path / f"{name}.json").read_text())["levels"][0]["summary"]
        assert summary["num_turns"] == 1 and summary["failed_turns"] == 0
        assert summary["metrics"]["client_ttfp_ms"]["mean"] > 0
        assert summary["metrics"]["server_ttfp_ms"]["mean"] > 0
    assert "the gateway added" in capsys.readouterr().out
