"""Move contract dataclasses across the Python-backend boundary.

Numeric tensors go through DLPack both ways: zero-copy, and the stub's numpy output path
silently yields empty tensors under numpy >= 2 (ARCHITECTURE.md section 3). Strings use
the numpy object path, the only one the stub offers for them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

from backends.stages.tensor_codec import ContractError, from_arrays, tensor_specs, to_arrays


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    if tensor.is_cpu() and _is_bytes(tensor):
        return tensor.as_numpy()
    # Copy: request tensors live in shared memory that is reused once execute returns.
    return torch_dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy().copy()


def _is_bytes(tensor: Any) -> bool:
    # pb_utils.Tensor has no dtype query in 2.51; BYTES tensors are the ones without DLPack.
    try:
        tensor.to_dlpack()
    except Exception:  # the stub raises TritonModelException, which we cannot import here
        return True
    return False


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
            tensors.append(pb_utils.Tensor(name, array))
        else:
            tensors.append(pb_utils.Tensor.from_dlpack(name, torch_dlpack.to_dlpack(_c_order(array))))
    return tensors


def _c_order(array: np.ndarray) -> torch.Tensor:
    """A tensor with canonical C strides, which the stub checks on every dim. numpy (and
    torch.from_numpy) give empty arrays arbitrary strides, e.g. (0, 0) for shape (0, 64)."""
    if array.size == 0:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0].copy()).dtype)
    return torch.from_numpy(array.copy(order="C"))


__all__ = ["ContractError", "decode_request", "encode_response", "output_tensors", "tensor_specs"]
