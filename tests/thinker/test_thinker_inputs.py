"""The Thinker stage's Triton configuration declares every `ThinkerRequest` field as an input
of the tensor type the codec sends (backends/contracts/tensor_codec.py): a session setting
missing there would be refused by Triton before the stage sees it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from backends.contracts.messages import ThinkerRequest

ROOT = Path(__file__).resolve().parents[2]
SCALARS = {"int": "TYPE_INT64", "float": "TYPE_FP32", "bool": "TYPE_BOOL", "str": "TYPE_UINT8"}


def _inputs(name: str) -> dict[str, str]:
    text = (ROOT / "model_repository" / "thinker" / name).read_text()
    block = text.split("input [", 1)[1].split("\n]", 1)[0]
    return dict(re.findall(r'name: "(\w+)" data_type: (\w+)', block))


@pytest.mark.parametrize("name", ["config.pbtxt.tmpl", "config.pbtxt"])
def test_every_request_field_is_an_input(name: str) -> None:
    inputs = _inputs(name)
    fields = dataclasses.fields(ThinkerRequest)
    assert set(inputs) == {f.name.upper() for f in fields}
    for field in fields:
        if field.type in SCALARS:
            assert inputs[field.name.upper()] == SCALARS[field.type], field.name
