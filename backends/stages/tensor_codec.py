"""Dataclass <-> named numpy arrays: the one place that maps contract fields to tensors.

A contract field becomes the tensor named after it in upper case. Scalars travel as
one-element tensors; arrays declare dtype and rank with `array_field`. Decoding validates
dtype, rank and presence and raises `ContractError` (a ValueError) naming the tensor, so a bad
request becomes an INVALID_ARG answer instead of an exception deep in an engine.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

_SCALAR_DTYPES: dict[type, Any] = {str: np.object_, int: np.int64, float: np.float32, bool: np.bool_}
_TRITON_DTYPES: dict[Any, str] = {
    np.object_: "TYPE_STRING", np.int64: "TYPE_INT64", np.int32: "TYPE_INT32",
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
    is_scalar: bool  # a str/int/float/bool field carried as a one-element tensor

    @property
    def triton_dtype(self) -> str:
        return _TRITON_DTYPES[self.dtype]


def tensor_specs(cls: type) -> list[TensorSpec]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        is_scalar = "dtype" not in f.metadata
        if is_scalar:
            dtype, dims = _SCALAR_DTYPES[hints[f.name]], (1,)
        else:
            dtype, dims = f.metadata["dtype"], f.metadata["dims"]
        specs.append(TensorSpec(f.name.upper(), f.name, dtype, dims, optional, is_scalar))
    return specs


def to_arrays(obj: Any) -> dict[str, np.ndarray]:
    """Encode a contract instance as {tensor name: array}."""
    out = {}
    for spec in tensor_specs(type(obj)):
        value = getattr(obj, spec.field)
        if spec.dtype is np.object_:
            out[spec.name] = np.array([value.encode("utf-8")], dtype=np.object_)
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
    if spec.dtype is np.object_:
        if not isinstance(value, (bytes, str)):
            raise ContractError(f"{spec.name} must be a string")
        return value.decode("utf-8", errors="strict") if isinstance(value, bytes) else value
    if array.dtype.type is not spec.dtype:
        raise ContractError(f"{spec.name} must be {np.dtype(spec.dtype).name}, got {array.dtype.name}")
    return {np.int64: int, np.float32: float, np.bool_: bool}[spec.dtype](value)
