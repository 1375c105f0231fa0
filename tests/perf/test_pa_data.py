"""The committed perf_analyzer data (perf/pa_data/) is what perf/pa_inputs.py writes today, so
it cannot drift from the stage contracts; its README's command lines name every file."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perf.pa_inputs import STAGES, StageDims, duplex_data, stage_data
from perf.workload import load_voices

DATA = Path(__file__).resolve().parents[2] / "perf" / "pa_data"
UNITS, DUPLEX_SECONDS = 3, 4.0  # as perf/pa_data/README.md says they were written


def generated(model: str) -> dict:
    if model == "duplex":
        voices = load_voices()
        data = duplex_data(voices[sorted(voices)[0]], DUPLEX_SECONDS, 1)
    else:
        dims = StageDims.for_checkpoint("tiny") if model == "talker" else None
        data = stage_data(model, 0, UNITS, dims)
    return json.loads(json.dumps(data))  # the floats as JSON holds them


@pytest.mark.parametrize("model", [*STAGES, "duplex"])
def test_the_committed_data_is_what_pa_inputs_writes(model):
    assert json.loads((DATA / f"{model}.json").read_text()) == generated(model), \
        f"regenerate: python -m perf.pa_inputs --model {model} ... --out perf/pa_data/{model}.json"


def test_the_readme_has_a_command_line_for_every_file():
    text = (DATA / "README.md").read_text()
    for model in [*STAGES, "duplex"]:
        assert re.search(rf"perf_analyzer -m {model} .*--input-data perf/pa_data/{model}\.json", text), model
