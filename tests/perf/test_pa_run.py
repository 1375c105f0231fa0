"""perf/pa_run.py: the perf_analyzer command lines (streaming stage runs at concurrency 1 per
scripted session; `duplex` in request-rate mode at real-time pace per sequence)."""
from __future__ import annotations

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
