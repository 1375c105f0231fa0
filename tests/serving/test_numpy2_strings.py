"""Strings across the Python-backend stub under numpy 2 (backends/serving/triton_tensors.py).

The 2.51 stub sizes a BYTES tensor it builds with a pybind11 that reads numpy 1's dtype
layout: under numpy 2 it takes the dtype's `flags` for the item size, and the tensor goes
out empty. `StubTensor` re-enacts that sizing around the stub's real
`serialize_byte_tensor`, for either layout, so this runs under the project's numpy 1.26;
scripts/check_numpy2_stub.sh runs a real server under numpy 2.
"""
from __future__ import annotations

import importlib.util
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
import pytriton
from tritonclient.utils import deserialize_bytes_tensor

from backends.serving import triton_tensors
from backends.serving.triton_tensors import output_tensors

ROOT = Path(__file__).resolve().parents[2]
STUB_UTILS = Path(pytriton.__file__).parent / "tritonserver/backends/python/triton_python_backend_utils.py"
CLIENT_FACING_STRINGS = {("duplex", "EVENT")}


def _stub_module(numpy2: bool) -> types.ModuleType:
    """The stub's `triton_python_backend_utils` with a `Tensor` that sizes BYTES like the stub."""
    spec = importlib.util.spec_from_file_location("stub_python_backend_utils", STUB_UTILS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class StubTensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            # pb_tensor.cc: serialize through the module attribute, then byte_size_ = nbytes()
            serialized = np.asarray(module.serialize_byte_tensor(array))
            item_size = serialized.dtype.flags if numpy2 else serialized.dtype.itemsize
            self.name, self.wire = name, serialized.tobytes()[:serialized.size * item_size]

    module.Tensor = StubTensor
    return module


def _client_reads(tensor: object) -> list[bytes]:
    return list(deserialize_bytes_tensor(tensor.wire))


def test_the_word_dtype_reads_the_same_under_both_layouts():
    assert triton_tensors._WORD.itemsize == 8 and triton_tensors._WORD.flags == 8


def test_a_plain_bytes_tensor_goes_out_empty_under_numpy2():
    """The bug itself: the stub's own path, as `duplex` used it for EVENT."""
    event = np.array([b'{"type": "session.created"}'], dtype=np.object_)
    assert _stub_module(numpy2=True).Tensor("EVENT", event).wire == b""
    assert _client_reads(_stub_module(numpy2=False).Tensor("EVENT", event)) == [event[0]]


@pytest.mark.parametrize("numpy2", [False, True])
@pytest.mark.parametrize("length", range(8))
def test_json_outputs_arrive_whole_under_both_layouts(numpy2, length):
    pb = _stub_module(numpy2)
    document = json.dumps({"type": "response.audio.delta", "text": "ü" * length})
    (tensor,) = output_tensors(pb, {"EVENT": np.array([document.encode("utf-8")], dtype=np.object_)})
    (received,) = _client_reads(tensor)
    assert json.loads(received) == json.loads(document)
    assert received.rstrip(b" ") == document.encode("utf-8") and len(tensor.wire) % 8 == 0


def test_the_serializer_is_wrapped_once_and_passes_other_sizes_through():
    pb = _stub_module(numpy2=True)
    original = pb.serialize_byte_tensor
    for _ in range(2):
        output_tensors(pb, {"STATUS": np.array([b"{}"], dtype=np.object_)})
    assert pb.serialize_byte_tensor.in_words and pb.serialize_byte_tensor is not original
    odd = np.array([b"abc"], dtype=np.object_)  # 7 bytes serialized: not ours, left as it was
    assert pb.serialize_byte_tensor(odd) == original(odd)
    assert pb.serialize_byte_tensor(np.array([b"abcd"], dtype=np.object_)).dtype == triton_tensors._WORD


def _string_tensors(config: Path) -> set[tuple[str, str]]:
    text = config.read_text()
    return {(config.parent.name, name) for name in re.findall(r'name: "(\w+)" data_type: TYPE_STRING', text)}


def test_only_client_facing_outputs_are_strings():
    """A stub under numpy 2 dies reading a BYTES input: strings may only leave the server,
    never travel between our models."""
    configs = list(ROOT.glob("model_repository/*/config.pbtxt.tmpl"))
    assert len(configs) == 4
    found = set().union(*(_string_tensors(config) for config in configs))
    assert found == CLIENT_FACING_STRINGS
    for model, name in CLIENT_FACING_STRINGS:
        outputs = (ROOT / "model_repository" / model / "config.pbtxt.tmpl").read_text().split("output [", 1)[1]
        assert f'name: "{name}"' in outputs.split("\n]", 1)[0]
