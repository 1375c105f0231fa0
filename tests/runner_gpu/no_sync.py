"""A runner step or decode chain queued under torch's sync debug mode: any host-device sync
raises."""
from __future__ import annotations

import torch

from backends.runner.async_output import PendingStep
from backends.runner.decode_chain import PendingChain
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


def launch_chain_without_host_sync(
    runner: ModelRunner, inputs: list[StepInput], length: int
) -> PendingChain:
    """`runner.launch_chain(inputs, length)` with syncs as errors; the caller waits."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return runner.launch_chain(inputs, length)
    finally:
        torch.cuda.set_sync_debug_mode(0)
