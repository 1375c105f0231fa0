"""Dataclass <-> named numpy arrays: the one place that maps contract fields to tensors.

A contract field becomes the tensor named after it in upper case. int/float/bool scalars
travel as one-element tensors; a str travels as its UTF-8 bytes, a uint8 [-1] tensor; arrays
declare dtype and rank with `array_field`. Decoding validates dtype, rank and presence and
raises `ContractError` (a ValueError) naming the tensor, so a bad request becomes an
INVALID_ARG answer instead of an exception deep in an engine.

Why not TYPE_STRING: a Python-backend stub under numpy >= 2 reads every BYTES tensor it is
handed as garbage (and dies of it) and sends every BYTES tensor it builds empty (the stub's
pybind11 reads numpy 1's dtype layout: backends/serving/triton_tensors.py). uint8 tensors move
through DLPack like every other number, whatever the numpy version.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

_SCALAR_DTYPES: dict[type, Any] = {int: np.int64, float: np.float32, bool: np.bool_}
_TRITON_DTYPES: dict[Any, str] = {
    np.uint8: "TYPE_UINT8", np.int64: "TYPE_INT64", np.int32: "TYPE_INT32",
    np.int16: "TYPE_INT16", np.float32: "TYPE_FP32", np.bool_: "TYPE_BOOL",
}


class ContractError(ValueError):
    """A request does not match its stage contract."""


def array_field(dtype: Any, *dims: int, optional: bool = False) -> Any:
    """Declare an array field: its dtype and dims (-1 = any size). Optional ones default to empty."""
    metadata = {"dtype": np.dtype(dtype).type, "dims": tuple(dims)}
    if not optional:
        return dataclasses.field(metadata=metadata)
    empty_shape = tuple(0 for _ in dims)
    return dataclasses.field(default_factory=lambda: np.zeros(empty_shape, dtype), metadata=metadata)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str  # tensor name (field name in upper case)
    field: str
    dtype: Any  # numpy scalar type
    dims: tuple[int, ...]
    optional: bool
    is_scalar: bool  # an int/float/bool field carried as a one-element tensor
    is_text: bool = False  # a str field carried as its UTF-8 bytes (uint8 [-1])

    @property
    def triton_dtype(self) -> str:
        return _TRITON_DTYPES[self.dtype]


def tensor_specs(cls: type) -> list[TensorSpec]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        name = f.name.upper()
        if hints[f.name] is str:
            specs.append(TensorSpec(name, f.name, np.uint8, (-1,), optional, False, is_text=True))
        elif "dtype" not in f.metadata:
            specs.append(TensorSpec(name, f.name, _SCALAR_DTYPES[hints[f.name]], (1,), optional, True))
        else:
            specs.append(TensorSpec(name, f.name, f.metadata["dtype"], f.metadata["dims"], optional, False))
    return specs


def encode_text(text: str) -> np.ndarray:
    """A str field's tensor: its UTF-8 bytes, uint8 [n] (n = 0 for "")."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def to_arrays(obj: Any) -> dict[str, np.ndarray]:
    """Encode a contract instance as {tensor name: array}."""
    out = {}
    for spec in tensor_specs(type(obj)):
        value = getattr(obj, spec.field)
        if spec.is_text:
            out[spec.name] = encode_text(value)
        elif spec.is_scalar:
            out[spec.name] = np.array([value], dtype=spec.dtype)
        else:
            out[spec.name] = np.ascontiguousarray(value, dtype=spec.dtype)
    return out


def from_arrays(cls: type, get: Callable[[str], np.ndarray | None]) -> Any:
    """Decode a contract instance; `get(name)` returns the tensor or None when absent."""
    kwargs = {}
    for spec in tensor_specs(cls):
        array = get(spec.name)
        if array is None:
            if not spec.optional:
                raise ContractError(f"missing required input tensor {spec.name}")
            continue
        kwargs[spec.field] = _decode(spec, array)
    return cls(**kwargs)


def _decode(spec: TensorSpec, array: np.ndarray) -> Any:
    if spec.is_text:
        return _decode_text(spec, array)
    if spec.is_scalar:
        return _decode_scalar(spec, array)
    if array.dtype.type is not spec.dtype:
        raise ContractError(f"{spec.name} must be {np.dtype(spec.dtype).name}, got {array.dtype.name}")
    if array.ndim != len(spec.dims):
        raise ContractError(f"{spec.name} must have rank {len(spec.dims)}, got shape {list(array.shape)}")
    return array


def _decode_scalar(spec: TensorSpec, array: np.ndarray) -> Any:
    if array.size != 1:
        raise ContractError(f"{spec.name} must hold exactly one element, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    if array.dtype.type is not spec.dtype:
        raise ContractError(f"{spec.name} must be {np.dtype(spec.dtype).name}, got {array.dtype.name}")
    return {np.int64: int, np.float32: float, np.bool_: bool}[spec.dtype](value)


def _decode_text(spec: TensorSpec, array: np.ndarray) -> str:
    if array.dtype.type is not np.uint8 or array.ndim != 1:
        raise ContractError(f"{spec.name} must be UTF-8 text as uint8 [-1], "
                            f"got {array.dtype.name} of shape {list(array.shape)}")
    try:
        return array.tobytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{spec.name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
