"""perf/pa_run.py: the perf_analyzer command lines (streaming stage runs at concurrency 1 per
scripted session; `duplex` in request-rate mode at real-time pace per sequence)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import perf.pa_run as pa_run
from backends.serving.stage_secret import write_secret_file
from perf.pa_run import build_parser, duplex_command, stage_command, stage_secret


@pytest.fixture(autouse=True)
def fake_binary(monkeypatch):
    monkeypatch.setattr(pa_run, "perf_analyzer_binary", lambda: "perf_analyzer")


def _flag(command, name):
    return command[command.index(name) + 1]


def test_stage_command_streams_one_session_in_order(tmp_path):
    args = build_parser().parse_args(["--model", "talker", "--url", "h:1"])
    command = stage_command(args, tmp_path / "d.json", tmp_path / "e.json")
    assert "--streaming" in command and _flag(command, "-i") == "grpc"
    assert _flag(command, "--concurrency-range") == "1"  # order within the session matters
    assert _flag(command, "--profile-export-file") == str(tmp_path / "e.json")
    assert "--request-parameter" not in command  # no secret file: a server without one


def test_stage_command_sends_the_stage_secret_from_its_file(tmp_path):
    secret_file = write_secret_file(tmp_path / "secret", "abc123")
    args = build_parser().parse_args(["--model", "thinker", "--stage-secret-file", str(secret_file)])
    command = stage_command(args, tmp_path / "d.json", tmp_path / "e.json", stage_secret(args))
    assert _flag(command, "--request-parameter") == "minicpmo_stage_secret:abc123:string"


def test_duplex_command_paces_every_sequence_in_real_time(tmp_path):
    args = build_parser().parse_args(["--model", "duplex", "--sequences", "3", "--append-ms", "200"])
    command = duplex_command(args, tmp_path / "d.json", tmp_path / "e.json")
    assert _flag(command, "--request-rate-range") == "15"  # 3 sequences x 5 appends per second
    assert _flag(command, "--num-of-sequences") == "3"
    assert "--concurrency-range" not in command  # a START stays open: concurrency mode would stall


def test_environment_puts_libcudart_first(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    paths = pa_run.pa_environment()["LD_LIBRARY_PATH"].split(":")
    assert paths[-1] == "/elsewhere"
    assert any(p.endswith("cuda_runtime/lib") for p in paths[:-1])


def _fake_perf_analyzer(tmp_path, body: str) -> str:
    script = tmp_path / "perf_analyzer"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("model", ["thinker", "duplex"])
def test_a_perf_analyzer_that_cannot_start_reports_its_error(model, tmp_path, monkeypatch, capsys):
    """The loader's own message, not a JSON of nulls: what failed, its output, its log."""
    loader = "perf_analyzer: error while loading shared libraries: libb64.so.0d: cannot open shared object file"
    binary = _fake_perf_analyzer(tmp_path, f"echo '{loader}' >&2; exit 127")
    monkeypatch.setattr(pa_run, "perf_analyzer_binary", lambda: binary)
    monkeypatch.setattr(pa_run, "stop_sessions", lambda *args: None)
    out = tmp_path / "out"
    assert pa_run.main(["--model", model, "--url", "http://h:1", "--out", str(out), "--timeout-s", "20"]) == 1
    assert loader in capsys.readouterr().err
    result = json.loads((out / f"{model}_latency.json").read_text())
    assert result["error"] == "perf_analyzer exited with 127, writing no profile export"
    assert loader in result["output"] and Path(result["log"]).is_file()
    assert None not in result.values()


def test_a_missing_perf_analyzer_is_reported(tmp_path, monkeypatch, capsys):
    def missing() -> str:
        raise FileNotFoundError("perf_analyzer not found: pip install 'tritonclient[all]==2.51.0'")

    monkeypatch.setattr(pa_run, "perf_analyzer_binary", missing)
    assert pa_run.main(["--model", "duplex", "--out", str(tmp_path)]) == 1
    assert "perf_analyzer not found" in capsys.readouterr().err


def test_a_malformed_url_exits_2(tmp_path, capsys):
    assert pa_run.main(["--model", "duplex", "--url", "h", "--out", str(tmp_path)]) == 2
    assert "host:port" in capsys.readouterr().err
