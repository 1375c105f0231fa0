"""The `duplex` health probe's recognition (is_health_probe) and its client (ask_duplex).

Strategy: requests built as Triton hands them to `execute` (flags, input tensors, parameters as
JSON) over the fake pb_utils. Only the exact probe form is a probe: every variation a client
could send with the mark (another flag set, audio, a session parameter, another value) is not,
and goes to the session manager like any request. The probe against a real server (answered at
once, slots freed, no session counted, a killed stub reported) runs in
tests/server/test_duplex_health_server.py.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from backends.serving.duplex_health import HEALTH_PARAMETER, PROBE_ID_PREFIX, ask_duplex, probe_id
from backends.serving.server_process import free_port
from backends.serving.triton_duplex import RELEASE_PARAMETER, is_health_probe, is_sequence_release

PROBE_PARAMETERS = json.dumps({HEALTH_PARAMETER: True})


@dataclass
class _Request:
    flags_value: int
    parameters_json: str = PROBE_PARAMETERS
    inputs: dict = field(default_factory=dict)

    def flags(self) -> int:
        return self.flags_value

    def parameters(self) -> str:
        return self.parameters_json


def _start_end(pb) -> int:
    return pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


def test_the_probe_form_is_a_probe(pb):
    assert is_health_probe(pb, _Request(_start_end(pb)))
    # Triton's own `triton_*` parameters may come along; they are not the client's.
    assert is_health_probe(pb, _Request(_start_end(pb), json.dumps(
        {HEALTH_PARAMETER: True, "triton_enable_empty_final_response": True})))


@pytest.mark.parametrize("flags", ["none", "start", "end"])
def test_the_mark_without_start_and_end_together_is_no_probe(pb, flags):
    """A session's START, append or END carrying the mark goes through the session manager."""
    value = {"none": 0, "start": pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
             "end": pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END}[flags]
    assert not is_health_probe(pb, _Request(value))


@pytest.mark.parametrize("name", ["AUDIO", "REF_AUDIO"])
def test_the_mark_with_audio_is_no_probe(pb, name):
    request = _Request(_start_end(pb), inputs={name: pb.Tensor(name, np.zeros(16000, np.int16))})
    assert not is_health_probe(pb, request)


@pytest.mark.parametrize("parameters", [
    {HEALTH_PARAMETER: True, "instructions": "be brief"},  # a session START in disguise
    {HEALTH_PARAMETER: True, "action": "commit"},
    {HEALTH_PARAMETER: True, RELEASE_PARAMETER: True},
    {HEALTH_PARAMETER: 1}, {HEALTH_PARAMETER: "true"}, {HEALTH_PARAMETER: False}, {}, [HEALTH_PARAMETER],
])
def test_the_mark_with_anything_else_is_no_probe(pb, parameters):
    assert not is_health_probe(pb, _Request(_start_end(pb), json.dumps(parameters)))


def test_malformed_parameters_are_no_probe(pb):
    for text in ("", "not json", "null"):
        assert not is_health_probe(pb, _Request(_start_end(pb), text)), text


def test_a_probe_is_no_sequence_release(pb):
    """The probe mark does not free another sequence: the two marks are apart."""
    assert not is_sequence_release(_Request(_start_end(pb)))


def test_each_probe_has_a_fresh_sequence_id():
    ids = {probe_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith(PROBE_ID_PREFIX) for i in ids)


def test_an_unreachable_server_fails_the_probe_at_once():
    start = time.monotonic()
    problem = ask_duplex(f"127.0.0.1:{free_port()}", timeout_s=5)
    assert problem, "nothing listens there: the probe must fail"
    assert time.monotonic() - start < 5, "a refused connection is not a timeout"
