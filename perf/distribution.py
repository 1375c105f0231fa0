"""A summary of measured values (count, mean, median, P99, max), free of client imports so
in-process benchmarks use it without tritonclient."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float | None
    median: float | None
    p99: float | None
    max: float | None

    @staticmethod
    def of(values: Iterable[float]) -> "Distribution":
        data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
        if data.size == 0:
            return Distribution(0, None, None, None, None)
        return Distribution(int(data.size), float(data.mean()), float(np.median(data)),
                            float(np.percentile(data, 99)), float(data.max()))
