"""A runner step queued under torch's sync debug mode: any host-device sync raises."""
from __future__ import annotations

import torch

from backends.runner.async_output import PendingStep
from backends.runner.model_runner import ModelRunner
from backends.runner.types import StepInput


def launch_without_host_sync(runner: ModelRunner, inputs: list[StepInput]) -> PendingStep:
    """`runner.launch_step(inputs)` with syncs as errors; the caller waits on the result."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return runner.launch_step(inputs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
