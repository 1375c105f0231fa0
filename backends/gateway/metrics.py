"""Prometheus metrics of the gateway, served as text at /metrics on the gateway's port:
connections, sessions, queue length and wait, frames and bytes each way, errors by code."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

HELP = {
    "minicpmo_gateway_connections_total": ("counter", "WebSocket connections accepted, by protocol"),
    "minicpmo_gateway_refusals_total": ("counter", "connections refused before a session, by reason"),
    "minicpmo_gateway_sessions": ("gauge", "sessions holding an admission slot, by protocol"),
    "minicpmo_gateway_queue_length": ("gauge", "connections waiting for a slot"),
    "minicpmo_gateway_queue_capacity": ("gauge", "admission slots (the server's duplex max_sessions)"),
    "minicpmo_gateway_queue_wait_seconds_sum": ("counter", "time admitted connections waited"),
    "minicpmo_gateway_queue_wait_seconds_count": ("counter", "admitted connections"),
    "minicpmo_gateway_frames_total": ("counter", "WebSocket messages, by direction"),
    "minicpmo_gateway_bytes_total": ("counter", "WebSocket message bytes, by direction"),
    "minicpmo_gateway_errors_total": ("counter", "error messages sent to clients, by code"),
}


@dataclass
class GatewayMetrics:
    values: dict[str, dict[Labels, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))

    def add(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.values[name][tuple(sorted(labels.items()))] += amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self.values[name][tuple(sorted(labels.items()))] = value

    def get(self, name: str, **labels: str) -> float:
        return self.values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def frame(self, direction: str, size: int) -> None:
        self.add("minicpmo_gateway_frames_total", direction=direction)
        self.add("minicpmo_gateway_bytes_total", size, direction=direction)

    def render(self) -> str:
        lines = []
        for name, (kind, text) in HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(self.values.get(name, {}).items()):
                lines.append(f"{name}{_labels(labels)} {value:g}")
        return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels) + "}"
