"""The duplex benchmark (perf/duplex_bench.py) end to end in its short form on the shared
server, and perf_analyzer on a stage model (perf/pa_run.py) when its libraries are present.

Checks the numbers are consistent with each other, not that they are fast: the last audio
chunk cannot come before the first, so RTF * audio >= client TTFP, i.e. RTF >= TTFP / audio
>= TTFP / (TTFP + audio); the server's TTFP starts when the unit is complete, after the
client's first append, so it cannot exceed the client's; a forced reply of N units carries at
least N - 1 seconds of audio.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from server_resources import wait_for_gauges

from perf.duplex_bench import main as bench_main
from perf.pa_run import main as pa_main, pa_environment, perf_analyzer_binary, stop_sessions

pytestmark = pytest.mark.server

CLOCK_SLACK_MS = 5.0  # client and server stamps come from two processes' monotonic clocks
REPLY_UNITS = 2
PA_UNITS = 3  # unit requests of perf_analyzer's scripted Thinker session, before its stop
ROOT = Path(__file__).resolve().parents[2]
PA_README = ROOT / "perf" / "pa_data" / "README.md"


@pytest.fixture(scope="module")
def bench(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = bench_main([
        "--url", server.grpc_url, "--metrics-url", f"http://127.0.0.1:{server.metrics_port}/metrics",
        "--concurrency", "1", "--num-groups", "1", "--turns-per-group", "2", "--warmup-turns", "0",
        "--reply-units-min", str(REPLY_UNITS), "--reply-units-max", str(REPLY_UNITS),
        "--max-silence-s", "20", "--name", "short", "--out", str(out),
    ])
    return code, out


def test_short_benchmark_runs_and_writes_its_outputs(bench):
    code, out = bench
    assert code == 0
    text = (out / "short.md").read_text()
    assert "| 1 | 1 (0) | 2 (0, 0) | 0 |" in text
    data = json.loads((out / "short.json").read_text())
    assert [turn["ok"] for turn in data["levels"][0]["turns"]] == [True, True]


def test_numbers_are_consistent(bench):
    _, out = bench
    for turn in json.loads((out / "short.json").read_text())["levels"][0]["turns"]:
        ttfp, audio, rtf = turn["client_ttfp_ms"], turn["audio_ms"], turn["rtf"]
        assert rtf >= ttfp / (ttfp + audio)
        assert rtf * audio >= ttfp - CLOCK_SLACK_MS
        assert 0.0 < turn["server_ttfp_ms"] <= ttfp + CLOCK_SLACK_MS
        assert 0.0 < turn["server_ttft_ms"] <= turn["server_ttfp_ms"] + CLOCK_SLACK_MS
        assert audio >= (REPLY_UNITS - 1) * 1000.0
        assert turn["errors"] == [] and turn["num_responses"] == 1


def test_stage_breakdown_is_filled(bench):
    _, out = bench
    level = json.loads((out / "short.json").read_text())["levels"][0]
    estimate = level["unit_estimate"]
    assert estimate["speak_units"] == 2 * REPLY_UNITS
    assert estimate["decided_units"] >= estimate["speak_units"]
    assert estimate["thinker_ms"]["count"] + estimate["first_thinker_ms"]["count"] == estimate["decided_units"]


def _perf_analyzer_runs() -> bool:
    try:
        probe = subprocess.run([perf_analyzer_binary(), "--version"], capture_output=True, env=pa_environment(),
                               timeout=20)
    except (FileNotFoundError, OSError, subprocess.SubprocessError):
        return False
    return b"error while loading shared libraries" not in probe.stderr


def test_perf_analyzer_on_the_thinker(server, tmp_path):
    if not _perf_analyzer_runs():
        pytest.skip("perf_analyzer cannot start here (needs libb64-0d and libcudart.so.12)")
    code = pa_main(["--model", "thinker", "--url", server.grpc_url, "--units", str(PA_UNITS),
                    "--window-requests", str(PA_UNITS + 1), "--timeout-s", "60", "--out", str(tmp_path),
                    "--stage-secret-file", str(server.stage_secret_file)])
    assert code == 0
    result = json.loads((tmp_path / "thinker_latency.json").read_text())
    # At concurrency 1 the export holds whole count windows of consecutive requests, each at
    # least one scripted session long (its units and its stop): wherever a window starts or
    # ends, it holds a stop, and never more stops than unit results.
    assert result["requests"] >= result["acks"] > 0, result
    assert 0.0 < result["first_response_ms"]["mean"] < 10_000.0
    # perf_analyzer stops wherever its window ends; pa_run stops the sessions it cut short.
    idle = {("requests", "thinker"): 0.0, ("runner_requests", "thinker"): 0.0}
    assert wait_for_gauges(server, idle) == idle, "perf_analyzer's thinker sessions still hold KV"


def readme_block(url: str, secret_file: Path) -> list[str]:
    """perf/pa_data/README.md's command block, one command a line, pointed at this server."""
    [block] = re.findall(r"```bash\n(.*?)```", PA_README.read_text(), re.S)
    block = block.replace("127.0.0.1:8001", url).replace("var/secrets/stage-8001", str(secret_file))
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.parametrize("model", ["thinker", "duplex"])
def test_the_documented_perf_analyzer_line_runs_as_written(server, model):
    """The README's variable lines and its `perf_analyzer -m MODEL` line, in bash, from the
    repository root, with the README's PATH and LD_LIBRARY_PATH set-up."""
    if not _perf_analyzer_runs():
        pytest.skip("perf_analyzer cannot start here (needs libb64-0d and libcudart.so.12)")
    lines = readme_block(server.grpc_url, server.stage_secret_file)
    script = "\n".join([line for line in lines if "=" in line.split()[0]] +
                        [line for line in lines if line.startswith(f"perf_analyzer -m {model} ")])
    env = {**pa_environment(), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    try:
        run = subprocess.run(["bash", "-ec", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    finally:
        if model != "duplex":  # the run ends wherever its last window does, often inside the session
            stop_sessions(server.grpc_url, model, 1, server.stage_secret.strip())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Successfully read data for 1 stream" in run.stdout
    throughput = re.search(r"(?:Concurrency|Request Rate): \S+, throughput: ([0-9.]+) infer/sec", run.stdout)
    assert throughput and float(throughput.group(1)) > 0, run.stdout
    idle = {("requests", "thinker"): 0.0, ("sessions", "duplex"): 0.0}
    assert wait_for_gauges(server, idle) == idle, "the documented run left state behind"
