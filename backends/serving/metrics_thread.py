"""The one thread per model instance that talks to Triton's custom-metric API.

Triton 2.51 crashed (signal 11 in libtriton_python.so) when several threads of one process called
the custom-metric API concurrently (docs/triton_behaviours.md#custom-metrics). So every update of
an instance is queued here, and only this thread touches `pb_utils.MetricFamily` / `Metric`: it
creates families and labelled metrics lazily, and at shutdown deletes the metrics before their
families (the stub refuses a metric whose family is gone). Other metric writers of the process
(backends/serving/resource_gauges.py) run their calls here through `call`.

When the server runs with `--allow-metrics=false` the first family raises; the thread then
logs once and drops every later update, and the model keeps serving.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from backends.serving.metrics_catalog import COUNTER, GAUGE, HISTOGRAM, INSTANCE_LABELS, MetricSpec

log = logging.getLogger(__name__)

_STOP = object()
LabelKey = tuple[tuple[str, str], ...]


class MetricsThread:
    def __init__(self, pb_utils: Any, model: str, model_instance: str, name: str = "metrics") -> None:
        self._pb = pb_utils
        self._instance_labels = {"model": model, "model_instance": model_instance or model}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Owned by the metrics thread only.
        self._families: dict[str, Any] = {}
        self._metrics: dict[tuple[str, LabelKey], Any] = {}
        self._enabled = True
        self._thread = threading.Thread(target=self._run, name=f"{model}-{name}", daemon=True)
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def increment(self, spec: MetricSpec, value: float = 1.0, **labels: str) -> None:
        if spec.kind == HISTOGRAM:
            raise ValueError(f"{spec.name} is a histogram: observe() it")
        self._post(spec, "increment", value, labels)

    def set(self, spec: MetricSpec, value: float, **labels: str) -> None:
        if spec.kind != GAUGE:
            raise ValueError(f"{spec.name} is a {spec.kind}, only gauges can be set")
        self._post(spec, "set", value, labels)

    def observe(self, spec: MetricSpec, value: float, **labels: str) -> None:
        if spec.kind != HISTOGRAM:
            raise ValueError(f"{spec.name} is a {spec.kind}, only histograms observe")
        self._post(spec, "observe", value, labels)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the metrics thread (for other code that updates metrics)."""
        self._queue.put((fn, args))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Apply what is queued, delete the metrics (before their families), stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _post(self, spec: MetricSpec, op: str, value: float, labels: dict[str, str]) -> None:
        if set(labels) != set(spec.labels):
            raise ValueError(f"{spec.name} takes labels {sorted(spec.labels)}, got {sorted(labels)}")
        if spec.kind == COUNTER and value < 0:
            raise ValueError(f"{spec.name} is a counter: it cannot decrease (got {value})")
        self._queue.put((self._apply, (spec, op, float(value), tuple(sorted(labels.items())))))

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _STOP:
                fn, args = item
                try:
                    fn(*args)
                except Exception as exc:  # a failed update must not stop the others
                    log.warning("metric update %s failed: %r", getattr(fn, "__name__", fn), exc)
        finally:
            self._metrics.clear()
            self._families.clear()

    def _apply(self, spec: MetricSpec, op: str, value: float, labels: LabelKey) -> None:
        if not self._enabled:
            return
        metric = self._metric(spec, labels)
        if metric is not None:
            getattr(metric, op)(value)

    def _metric(self, spec: MetricSpec, labels: LabelKey) -> Any:
        key = (spec.name, labels)
        if key not in self._metrics:
            family = self._family(spec)
            if family is None:
                return None
            kwargs: dict[str, Any] = {"labels": {**self._instance_labels, **dict(labels)}}
            if spec.kind == HISTOGRAM:
                kwargs["buckets"] = list(spec.buckets)
            self._metrics[key] = family.Metric(**kwargs)
        return self._metrics[key]

    def _family(self, spec: MetricSpec) -> Any:
        if spec.name not in self._families:
            cls = self._pb.MetricFamily
            kind = {COUNTER: cls.COUNTER, GAUGE: cls.GAUGE, HISTOGRAM: cls.HISTOGRAM}[spec.kind]
            try:
                self._families[spec.name] = cls(name=spec.name, description=spec.description, kind=kind)
            except Exception as exc:  # --allow-metrics=false, or a server without custom metrics
                log.warning("custom metrics disabled for %s: %r", self._instance_labels["model"], exc)
                self._enabled = False
                return None
        return self._families[spec.name]


__all__ = ["MetricsThread", "INSTANCE_LABELS"]
