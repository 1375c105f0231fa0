"""Profiles and placement: the gpu and gpu-split renderings (on CPU: rendering needs no GPU),
the placement rules the variables enforce, and the one documented variables table.

Strategy: render each GPU profile into a temporary repository and read back instance groups
and parameters per model; feed every placement rule a violating value; parse the table in
deploy/README.md and compare it cell by cell with the Profile fields and profile values, and the
metrics table of docs/metrics.md with the metrics catalog.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from backends.serving.metrics_catalog import ALL_METRICS
from backends.serving.profiles import PROFILES, get_profile
from backends.serving.repository import render_repository

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"
README = ROOT / "deploy" / "README.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
TABLE_PROFILES = ("cpu", "gpu", "gpu-split", "gpu-h200")


def _render(tmp_path: Path, profile_name: str, **overrides: str) -> dict[str, str]:
    profile = get_profile(profile_name).with_overrides(overrides)
    out = render_repository(REPO, tmp_path / profile_name, profile)
    return {d.name: (d / "config.pbtxt").read_text() for d in out.iterdir() if (d / "config.pbtxt").exists()}


def _instance_group(config: str) -> str:
    return re.search(r"instance_group \[ \{ (.*?) \} \]", config).group(1).strip()


def _param(config: str, key: str) -> str:
    return re.search(rf'key: "{key}" value {{ string_value: "([^"]*)" }}', config).group(1)


def test_gpu_split_puts_the_thinker_and_the_audio_tail_on_different_gpus(tmp_path):
    configs = _render(tmp_path, "gpu-split")
    assert _instance_group(configs["thinker"]) == "count: 1 kind: KIND_GPU gpus: [ 0 ]"
    assert _instance_group(configs["talker"]) == "count: 1 kind: KIND_GPU gpus: [ 1 ]"
    assert _instance_group(configs["code2wav"]) == "count: 1 kind: KIND_GPU gpus: [ 1 ]"
    assert [_param(configs[s], "gpu_memory_fraction") for s in ("thinker", "talker", "code2wav")] == \
        ["0.9", "0.45", "0.45"]
    assert _instance_group(configs["duplex"]) == "count: 4 kind: KIND_CPU"
    assert _param(configs["duplex"], "max_sessions") == "16", "64 sessions over 4 orchestrator instances"
    assert "max_candidate_sequences: 44" in configs["duplex"], "16 sessions + 28 refusal slots per instance"
    assert all(_param(configs[s], "max_sessions") == "64" for s in ("thinker", "talker", "code2wav"))
    assert sorted(configs) == ["code2wav", "duplex", "talker", "thinker"]


def test_gpu_puts_every_stage_on_gpu_zero_with_caps(tmp_path):
    configs = _render(tmp_path, "gpu")
    for stage in ("thinker", "talker", "code2wav"):
        assert _instance_group(configs[stage]) == "count: 1 kind: KIND_GPU gpus: [ 0 ]"
        assert _param(configs[stage], "device") == "cuda" and _param(configs[stage], "dtype") == "bfloat16"
    assert sum(float(_param(configs[s], "gpu_memory_fraction")) for s in ("thinker", "talker", "code2wav")) <= 0.95


def test_overrides_move_a_stage(tmp_path):
    configs = _render(tmp_path, "gpu-split", code2wav_gpus="2", code2wav_memory_fraction="0.8")
    assert _instance_group(configs["code2wav"]) == "count: 1 kind: KIND_GPU gpus: [ 2 ]"
    assert _instance_group(configs["talker"]) == "count: 1 kind: KIND_GPU gpus: [ 1 ]"


@pytest.mark.parametrize("profile, overrides, message", [
    ("gpu", {"thinker_gpus": "0,1"}, "one GPU id"),
    ("gpu", {"talker_gpus": ""}, "one GPU id"),
    ("cpu", {"thinker_gpus": "0"}, "must be empty with KIND_CPU"),
    ("cpu", {"talker_memory_fraction": "0.3"}, "GPU stages only"),
    ("gpu", {"thinker_memory_fraction": "0.9"}, "add up to 1.35"),
    ("gpu-split", {"talker_memory_fraction": "1.5"}, r"must be in \[0, 1\]"),
    ("gpu", {"device": "cpu"}, "does not match instance_kind"),
    ("gpu", {"max_sessions": "31"}, "multiple of duplex_instances"),
    ("cpu", {"duplex_instances": "0"}, "duplex_instances must be positive"),
    ("cpu", {"max_sessions": "many"}, "max_sessions='many'"),
    ("cpu", {"fault_injection": "maybe"}, "fault_injection must be one of"),
    ("gpu", {"code2wav_first_hold_ms": "5000"}, r"code2wav_first_hold_ms must lie in \[0, 1000\]"),
    ("gpu", {"code2wav_first_hold_ms": "-1"}, r"code2wav_first_hold_ms must lie in \[0, 1000\]"),
])
def test_placement_rules_refuse_what_cannot_work(profile, overrides, message):
    with pytest.raises(ValueError, match=message):
        get_profile(profile).with_overrides(overrides)


def _table(heading: str, page: Path = README) -> list[list[str]]:
    section = page.read_text().split(f"## {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]  # skip the header


def test_the_variables_table_documents_every_variable_with_its_values():
    rows = _table("Configuration variables")
    documented = [row[0].strip("`") for row in rows]
    fields = [f.name for f in dataclasses.fields(PROFILES["cpu"]) if f.name != "name"]
    assert documented == fields, "deploy/README.md table and Profile fields differ"
    for row in rows:
        name = row[0].strip("`")
        for column, profile in zip(row[1:5], TABLE_PROFILES):
            assert column == (str(getattr(PROFILES[profile], name)) or "-"), (name, profile)
        assert row[5], f"{name} has no description"
    assert sorted(PROFILES) == sorted(TABLE_PROFILES)


def test_the_metrics_table_lists_every_metric():
    rows = _table("Server metrics (Prometheus)", METRICS_DOC)
    assert [(row[0].strip("`"), row[1]) for row in rows] == [(m.name, m.kind) for m in ALL_METRICS]


def test_gpu_h200_renders_the_memory_plans_shares_and_the_sliding_window(tmp_path):
    configs = _render(tmp_path, "gpu-h200")
    shares = get_profile("gpu-h200").memory_plan().shares()
    for stage in ("thinker", "talker", "code2wav"):
        assert float(_param(configs[stage], "gpu_memory_fraction")) == shares[stage]
    assert _param(configs["thinker"], "sliding_window_mode") == "basic"
    assert _param(configs["thinker"], "max_context_tokens") == "4096"


def test_the_thinker_takes_the_profiles_sliding_window_default():
    from backends.stages.factory import build_thinker_engine

    engine = build_thinker_engine({"checkpoint": "tiny", "max_sessions": "1", "sliding_window_mode": "basic"})
    assert engine.config.window_mode == "basic"
