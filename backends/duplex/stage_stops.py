"""Explicit stops of a session's stage requests.

The orchestrator never cancels a stage request (in Triton 2.51 a cancellation that races the
request's end can crash the gRPC frontend the stage calls go through), so a barge-in or a close
frees the stage state of the old epoch by sending each stage a `stop` for its request id.
A stop is idempotent and cheap; a stage that is down must not block a close. During server
shutdown the stage models are finalizing too, and a stage call then may wait out the whole
stage timeout, so the stops are switched off (the stages free everything on their own when
they finalize).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from backends.contracts.stage_clients import STAGES, StageClients

log = logging.getLogger(__name__)


class StageStops:
    def __init__(self, stages: StageClients) -> None:
        self._stages = stages
        self._enabled = True  # cleared once, at server shutdown; read without a lock (a bool)

    def disable(self) -> None:
        self._enabled = False

    def stop(self, request_id: str, stages: Iterable[str] = STAGES) -> None:
        if not self._enabled:
            return
        for stage in stages:
            try:
                self._stages.stop(stage, request_id)
            except Exception as exc:  # a stage that is down must not block the close
                log.warning("stop of %s %s failed: %r", stage, request_id, exc)
