"""Repository rendering: committed config.pbtxt files are the cpu rendering of their
templates, every stage config declares exactly its contract's tensors, and the renderer
refuses unknown variables and missing values."""
import re
from pathlib import Path

import pytest

from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult,
)
from backends.contracts.tensor_codec import tensor_specs
from backends.serving.profiles import PROFILES, get_profile
from backends.serving.repository import committed_config_is_current, render_repository, render_template

REPO = Path(__file__).resolve().parents[2] / "model_repository"
CONTRACTS = {"thinker": (ThinkerRequest, ThinkerUnitResult), "talker": (TalkerRequest, TalkerCodes),
             "code2wav": (Code2WavRequest, Code2WavAudio)}
TENSOR = re.compile(r'\{ name: "(\w+)" data_type: (\w+) dims: \[ ([-\d, ]+) \]( optional: true)? \}')


def _block(text: str, kind: str) -> list[tuple[str, str, tuple[int, ...], bool]]:
    body = text.split(f"{kind} [", 1)[1].split("\n]", 1)[0]
    return [(n, t, tuple(int(d) for d in dims.split(",")), bool(opt)) for n, t, dims, opt in TENSOR.findall(body)]


def test_committed_configs_are_the_cpu_rendering():
    assert committed_config_is_current(REPO, get_profile("cpu")) == []


@pytest.mark.parametrize("stage", sorted(CONTRACTS))
def test_stage_config_matches_its_contract(stage):
    text = (REPO / stage / "config.pbtxt").read_text()
    request_cls, result_cls = CONTRACTS[stage]
    want_in = [(s.name, s.triton_dtype, s.dims, s.optional) for s in tensor_specs(request_cls)]
    want_out = [(s.name, s.triton_dtype, s.dims, False) for s in tensor_specs(result_cls)]
    assert _block(text, "input") == want_in
    assert _block(text, "output") == want_out


def test_gpu_profile_renders_gpu_instances(tmp_path):
    out = render_repository(REPO, tmp_path / "repo", get_profile("gpu"))
    thinker = (out / "thinker" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU gpus: [ 0 ]" in thinker and '"full-random"' in thinker
    assert not list(out.glob("*/config.pbtxt.tmpl"))


def test_overrides_are_typed_and_unknown_names_refused():
    profile = get_profile("cpu").with_overrides({"max_sessions": "9"})
    assert profile.max_sessions == 9 and profile.template_vars()["max_sessions"] == "9"
    with pytest.raises(ValueError, match="unknown configuration variables"):
        get_profile("cpu").with_overrides({"max_sesions": "9"})
    with pytest.raises(ValueError, match="max_sessions must be positive"):
        get_profile("cpu").with_overrides({"max_sessions": "0"})
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("tpu")


def test_missing_template_value_is_an_error():
    with pytest.raises(ValueError, match="nope"):
        render_template("count: ${nope}", PROFILES["cpu"].template_vars())
