"""A stand-in for `triton_python_backend_utils` with just what the serving glue calls.

Custom metrics record every call with the calling thread and keep their values; families and
metrics log their deletion (a metric deleted after its family is what the real stub refuses).
Requests, tensors and responses are plain objects; a BLS request (only the orchestrator's own
sequence END uses one) is recorded in `bls_requests` and answered with one empty response.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils import dlpack as torch_dlpack

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Logger:
    lines: list[tuple[str, str]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.lines.append(("error", message))

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.lines.append(("warn", message))

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(("info", message))


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> "Tensor":
        return Tensor(name, torch_dlpack.from_dlpack(capsule).numpy().copy())

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise RuntimeError("BYTES tensors have no DLPack")
        return torch_dlpack.to_dlpack(torch.from_numpy(np.ascontiguousarray(self._array)))


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._outputs, self._error = output_tensors or [], error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


@dataclass
class Sender:
    sent: list[tuple[InferenceResponse | None, int]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()


@dataclass
class Request:
    inputs: dict[str, Tensor]
    sender: Sender = field(default_factory=Sender)
    parameters_json: str = "{}"  # what `parameters()` returns: the request's parameters as JSON

    def get_response_sender(self) -> Sender:
        return self.sender

    def parameters(self) -> str:
        return self.parameters_json


def request_from_arrays(arrays: dict[str, np.ndarray]) -> Request:
    return Request({name: Tensor(name, array) for name, array in arrays.items()})


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    return request.inputs.get(name)


# ---- BLS ----------------------------------------------------------------------------------

bls_requests: list["InferenceRequest"] = []  # executed, in order


class InferenceRequest:
    def __init__(self, model_name: str, inputs: list[Tensor], requested_output_names: list[str],
                 correlation_id: int | str = 0, flags: int = 0, parameters: dict[str, Any] | None = None,
                 timeout: int = 0) -> None:
        self.model_name, self.inputs = model_name, {t.name(): t for t in inputs}
        self.correlation_id, self.flags, self.parameters = correlation_id, flags, parameters or {}

    def exec(self, decoupled: bool = False) -> list[InferenceResponse]:
        bls_requests.append(self)
        return [InferenceResponse()]


# ---- custom metrics -------------------------------------------------------------------------
# Values live in module dicts, not in the objects: the code under test owns (and deletes)
# its families and metrics as it would in the stub.

metric_calls: list[tuple[str, str, int]] = []  # (operation, family name, thread id)
deletions: list[str] = []  # "metric:<name>" / "family:<name>" in deletion order
family_kinds: dict[str, str] = {}
totals: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}  # counters and gauges
observations: dict[tuple[str, frozenset[tuple[str, str]]], list[float]] = {}  # histograms
buckets: dict[tuple[str, frozenset[tuple[str, str]]], list[float]] = {}
fail_families = threading.Event()  # set -> MetricFamily() raises, as with --allow-metrics=false


class Metric:
    def __init__(self, family_name: str, labels: dict[str, str], bucket_list: list[float] | None) -> None:
        self.family_name = family_name
        self.key = (family_name, frozenset(labels.items()))
        totals.setdefault(self.key, 0.0)
        if bucket_list is not None:
            buckets[self.key] = list(bucket_list)
            observations.setdefault(self.key, [])

    def _record(self, op: str) -> None:
        metric_calls.append((op, self.family_name, threading.get_ident()))

    def increment(self, value: float) -> None:
        self._record("increment")
        totals[self.key] += value

    def set(self, value: float) -> None:
        self._record("set")
        totals[self.key] = value

    def observe(self, value: float) -> None:
        self._record("observe")
        observations[self.key].append(value)

    def __del__(self) -> None:
        deletions.append(f"metric:{self.family_name}")


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

    def __init__(self, name: str, description: str, kind: str) -> None:
        metric_calls.append(("family", name, threading.get_ident()))
        if fail_families.is_set():
            raise RuntimeError("Failed to create metric family: metrics not supported")
        self.name = name
        family_kinds[name] = kind

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> Metric:  # noqa: N802
        metric_calls.append(("metric", self.name, threading.get_ident()))
        return Metric(self.name, labels, buckets)

    def __del__(self) -> None:
        deletions.append(f"family:{getattr(self, 'name', '?')}")


def reset() -> None:
    """Forget every recorded call, value and BLS request (call between tests)."""
    for registry in (metric_calls, deletions, bls_requests):
        registry.clear()
    for table in (family_kinds, totals, observations, buckets):
        table.clear()
    fail_families.clear()
    Logger.lines.clear()


def value(name: str, **labels: str) -> float:
    """Sum of the counter/gauge values of family `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (family, have), v in totals.items() if family == name and want <= have)


def observed(name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [x for (family, have), xs in observations.items() if family == name and want <= have for x in xs]
