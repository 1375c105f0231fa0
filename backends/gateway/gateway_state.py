"""What every connection of one gateway shares: its settings, the Triton client, the admission
queue, the metrics, and the live sessions (so that shutdown can close each with a reason)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc.aio as grpcaio

from backends.gateway.admission import AdmissionQueue
from backends.gateway.auth import ApiKeys
from backends.gateway.config import GatewayConfig
from backends.gateway.metrics import GatewayMetrics


@dataclass
class GatewayState:
    config: GatewayConfig
    admission: AdmissionQueue
    keys: ApiKeys
    client: grpcaio.InferenceServerClient | None = None  # made on the serving loop (app.py)
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    live: set[Any] = field(default_factory=set)  # the bridges of open connections
    shutting_down: bool = False

    def queue_gauges(self) -> None:
        self.metrics.set("minicpmo_gateway_queue_length", self.admission.waiting)
        self.metrics.set("minicpmo_gateway_queue_capacity", self.admission.capacity)
