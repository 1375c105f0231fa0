"""The `health` action of a stage: a request that asks whether the stage can serve.

A stage answers it at once, without its engine: an empty FINAL while its engine thread runs,
UNAVAILABLE once it is gone (backends/serving/triton_stage.py). The readiness probe sends it
(backends/serving/health.py). It is the one action served without the server's stage secret:
it reads whether the engine thread runs and holds nothing.
"""
from __future__ import annotations

import dataclasses

from backends.contracts.messages import Code2WavRequest, TalkerRequest, ThinkerRequest, stop_request

ACTION_HEALTH = "health"


def health_request(stage: str) -> ThinkerRequest | TalkerRequest | Code2WavRequest:
    """The health message of a stage: its stop request's required fields, action `health`."""
    return dataclasses.replace(stop_request(stage, f"health-{stage}"), action=ACTION_HEALTH)
