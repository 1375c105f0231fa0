"""The body of the `health` model (model_repository/health): a BLS health request per stage.

See backends/serving/health.py for why readiness needs it and how to call it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from backends.contracts.messages import stop_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving.health import ACTION_HEALTH, NOT_READY_PREFIX, OK, STAGE_NAMES, HealthReport
from backends.serving.triton_tensors import output_tensors


def health_request(stage: str) -> Any:
    """The health message of a stage: its stop request's required fields, action `health`."""
    return dataclasses.replace(stop_request(stage, f"health-{stage}"), action=ACTION_HEALTH)


class HealthModel:
    """The body of the `health` model: one BLS health request per stage, per probe."""

    def __init__(self, pb_utils: Any, params: dict[str, str]) -> None:
        self._pb = pb_utils
        names = [s.strip() for s in params.get("stages", ",".join(STAGE_NAMES)).split(",") if s.strip()]
        unknown = sorted(set(names) - set(STAGE_NAMES))
        if not names or unknown:
            raise ValueError(f"health model: stages must be a subset of {STAGE_NAMES}, got {names}")
        self._stages = tuple(names)
        self._timeout_us = int(float(params.get("timeout_s", "5")) * 1_000_000)

    def execute(self, requests: list[Any]) -> list[Any]:
        report = self.check()  # one check answers every probe of the batch
        return [self._answer(report) for _ in requests]

    def check(self) -> HealthReport:
        return HealthReport({stage: self._check_stage(stage) for stage in self._stages})

    def _check_stage(self, stage: str) -> str:
        pb = self._pb
        inputs = output_tensors(pb, to_arrays(health_request(stage)))
        try:
            bls = pb.InferenceRequest(model_name=stage, inputs=inputs, requested_output_names=[],
                                      timeout=self._timeout_us)
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    return response.error().message()
        except Exception as exc:  # the stage model is missing or its stub is gone
            return f"{type(exc).__name__}: {exc}"
        return OK

    def _answer(self, report: HealthReport) -> Any:
        pb = self._pb
        if not report.ready:
            error = pb.TritonError(NOT_READY_PREFIX + report.to_json(), pb.TritonError.UNAVAILABLE)
            return pb.InferenceResponse(error=error)
        status = output_tensors(pb, {"STATUS": np.array([report.to_json().encode("utf-8")], dtype=np.object_)})
        return pb.InferenceResponse(output_tensors=status)


