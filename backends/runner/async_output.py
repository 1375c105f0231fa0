"""Step outputs copied to the host asynchronously, and the one place where the host waits.

`AsyncOutput` queues device -> pinned-host copies on the current stream right after the work
that produced them and records an event; the host keeps working (or launches the next step)
until it needs the values. `AsyncOutput.wait` is the only call in the runner that blocks the
host on the device. `PendingStep` is a launched step whose results are collected by `wait`
(`Pending`: its host part runs once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

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


R = TypeVar("R")


class Pending(Generic[R]):
    """Launched device work whose host part (`finish`: outputs, hooks, bookkeeping) runs once,
    on the first `wait`. A finish that fails is never run again (it may have run some hooks
    already): its error is kept and raised to every later `wait`."""

    def __init__(self, finish: Callable[[], list[R]]) -> None:
        self._finish: Callable[[], list[R]] | None = finish
        self._results: list[R] = []
        self._error: Exception | None = None

    @property
    def is_finished(self) -> bool:
        return self._finish is None

    def wait(self) -> list[R]:
        finish, self._finish = self._finish, None
        if finish is not None:
            try:
                self._results = finish()
            except Exception as err:
                self._error = err
                raise
        if self._error is not None:
            raise self._error
        return self._results

    def settle(self) -> None:
        """Finish the work before touching the state it writes; a failure is its launcher's,
        raised by the launcher's own `wait`, so an unrelated call here does not fail with it."""
        with contextlib.suppress(Exception):
            self.wait()


class PendingStep(Pending[StepResult]):
    """A launched runner step."""

    @classmethod
    def done(cls, results: list[StepResult]) -> PendingStep:
        return cls(lambda: results)
