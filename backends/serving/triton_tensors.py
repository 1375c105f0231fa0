"""Move contract dataclasses across the Python-backend boundary.

The 2.51 stub is built with a pybind11 that predates numpy 2: it reads a dtype's item size
at the offset where numpy 2 keeps the dtype's `flags` (0 for numbers and bytes). So under
numpy >= 2 every tensor the stub sizes with numpy is empty (a tensor built from an array,
a BYTES tensor built from strings) and every tensor it unpacks into numpy is garbage (a
BYTES input or `as_numpy()`; a BYTES input even kills the stub before `execute` runs).

Hence: every tensor of our own stage contracts is numeric (str fields are UTF-8 uint8,
backends/contracts/tensor_codec.py) and moves through DLPack both ways. The only string left is
the client-facing JSON output (`duplex` EVENT), which only ever leaves a stub: `_bytes_tensor`
hands the stub its serialized bytes in a dtype whose item size reads right under both layouts. scripts/check_numpy2_stub.sh checks all this on a real
server under numpy 2.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from backends.contracts.tensor_codec import ContractError, from_arrays, tensor_specs, to_arrays


# '<U2': item size 8 and, in numpy 2, flags NPY_NEEDS_INIT = 8, so the stub reads 8 bytes
# per item under either layout (tests/serving/test_numpy2_strings.py pins both numbers).
_WORD = np.dtype("<U2")
_PAD = b" "  # JSON ignores trailing whitespace


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    # Copy: request tensors live in shared memory that is reused once execute returns.
    return torch_dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy().copy()


def decode_request(pb_utils: Any, request: Any, cls: type) -> Any:
    """Parse one Triton request into the contract `cls`; raises ContractError on bad input."""
    return from_arrays(cls, lambda name: _input(pb_utils, request, name))


def _input(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor_to_numpy(tensor)


def encode_response(pb_utils: Any, result: Any) -> Any:
    """Build an InferenceResponse carrying every field of the contract instance `result`."""
    return pb_utils.InferenceResponse(output_tensors=output_tensors(pb_utils, to_arrays(result)))


def output_tensors(pb_utils: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    tensors = []
    for name, array in arrays.items():
        if array.dtype == np.object_:
            tensors.append(_bytes_tensor(pb_utils, name, array))
        else:
            tensors.append(pb_utils.Tensor.from_dlpack(name, torch_dlpack.to_dlpack(_c_order(array))))
    return tensors


def _bytes_tensor(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """A BYTES tensor of JSON documents (or text) that survives the stub under any numpy:
    the last item is padded with spaces to a whole number of 8-byte words."""
    items = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in array.reshape(-1)]
    if items:
        size = sum(4 + len(item) for item in items)  # Triton's layout: u32 length + bytes
        items[-1] += _PAD * (-size % _WORD.itemsize)
    padded = np.empty(len(items), dtype=np.object_)
    padded[:] = items
    _serialize_in_words(pb_utils)
    return pb_utils.Tensor(name, padded.reshape(array.shape))


def _serialize_in_words(pb_utils: Any) -> None:
    """Make the stub's serializer (the stub calls `pb_utils.serialize_byte_tensor` from C++)
    return whole words as a `_WORD` array: its byte count then reads right under numpy 2."""
    original = getattr(pb_utils, "serialize_byte_tensor", None)
    if original is None or getattr(original, "in_words", False):
        return

    def serialize(array: np.ndarray) -> Any:
        flat = original(array)
        if isinstance(flat, bytes) and flat and len(flat) % _WORD.itemsize == 0:
            return np.frombuffer(flat, dtype=_WORD)
        return flat

    serialize.in_words = True  # type: ignore[attr-defined]
    pb_utils.serialize_byte_tensor = serialize


def _c_order(array: np.ndarray) -> torch.Tensor:
    """A tensor with canonical C strides, which the stub checks on every dim. numpy (and
    torch.from_numpy) give empty arrays arbitrary strides, e.g. (0, 0) for shape (0, 64)."""
    if array.size == 0:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0].copy()).dtype)
    return torch.from_numpy(array.copy(order="C"))


__all__ = ["ContractError", "decode_request", "encode_response", "output_tensors", "tensor_specs"]
