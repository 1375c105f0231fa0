"""The server's session capacity, read from the `duplex` model's configuration: its
`max_sessions` parameter (per instance) times its instances. The gateway keeps no second
setting that could disagree with the server."""
from __future__ import annotations

from typing import Any

import tritonclient.grpc.aio as grpcaio

from backends.gateway.duplex_stream import MODEL


def capacity_of(config: dict[str, Any]) -> int:
    """Sessions the model admits, from its config as JSON (get_model_config(as_json=True))."""
    per_instance = int(config["parameters"]["max_sessions"]["string_value"])
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [{}]))
    return per_instance * max(instances, 1)


async def server_capacity(client: grpcaio.InferenceServerClient) -> int:
    answer = await client.get_model_config(MODEL, as_json=True)
    return capacity_of(answer["config"])
