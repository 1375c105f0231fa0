"""Step outputs copied to the host asynchronously, and the one place where the host waits.

`AsyncOutput` queues device -> pinned-host copies on the current stream right after the work
that produced them and records an event; the host keeps working (or launches the next step)
until it needs the values. `AsyncOutput.wait` is the only call in the runner that blocks the
host on the device. `PendingStep` is a launched step whose results are collected by `wait`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from backends.runner.types import StepResult


class AsyncOutput:
    """Copies of named device tensors into host memory, readable after `wait`."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._host: dict[str, torch.Tensor] = {}
        # The device sources stay referenced until the copy is known to be done, so the
        # caching allocator cannot hand their memory to later work while it is being read.
        self._sources = tensors
        self._event: torch.cuda.Event | None = None
        for name, tensor in tensors.items():
            is_cuda = tensor.device.type == "cuda"
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=is_cuda)
            host.copy_(tensor, non_blocking=is_cuda)
            self._host[name] = host
        if any(t.device.type == "cuda" for t in tensors.values()):
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> dict[str, torch.Tensor]:
        """Block until the copies landed (the runner's single host wait); host tensors."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        self._sources = {}
        return self._host


class PendingStep:
    """A launched step; `wait` finishes its host work once (outputs, hooks, bookkeeping)."""

    def __init__(self, finish: Callable[[], list[StepResult]]) -> None:
        self._finish: Callable[[], list[StepResult]] | None = finish
        self._results: list[StepResult] | None = None

    @classmethod
    def done(cls, results: list[StepResult]) -> PendingStep:
        return cls(lambda: results)

    @property
    def is_finished(self) -> bool:
        return self._finish is None

    def wait(self) -> list[StepResult]:
        if self._finish is not None:
            self._results = self._finish()
            self._finish = None
        return self._results if self._results is not None else []
