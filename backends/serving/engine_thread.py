"""The one thread that owns a stage engine: commands in, steps out.

`execute()` never touches the engine: it posts commands (submit, stop) here and returns.
The thread drains all pending commands, then runs one engine step, and sleeps on the
command queue whenever the engine has nothing to do (no polling). An optional `observer` runs
on this thread after each round (the resource gauges: one thread per process updates metrics).
`on_inbox_wait` gets each submitted request's time in the queue: commands are drained between
steps, so a request posted during a forward waits for that forward to end, unless the engine
takes `attach_in_flight_drain`: it then runs the commands posted meanwhile from inside its step
while it waits for the GPU (ThinkerEngine lays out the new appends there); a shutdown met there
is held until the step ends.
An engine with pending work may ask to wait (`holding_s`, Code2Wav holding windows for an
announced first window): the thread then sleeps on the queue for that long instead of stepping.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Protocol

import torch

from backends.contracts.errors import StageError, StageFailure
from backends.contracts.sink import ResponseSink

log = logging.getLogger(__name__)

_STOP = object()


class SteppedEngine(Protocol):
    def submit(self, request: Any, sink: ResponseSink) -> None: ...

    def stop(self, request_id: str) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> None: ...


def _no_hold() -> float:
    return 0.0


class EngineThread:
    def __init__(self, engine: SteppedEngine, name: str, on_error: Callable[[str], None] | None = None,
                 observer: Callable[[], None] | None = None,
                 on_step: Callable[[float], None] | None = None,
                 on_inbox_wait: Callable[[float], None] | None = None) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._on_error = on_error or log.error
        self._observer = observer
        self._on_step = on_step  # called on this thread with each step's wall time in seconds
        self._on_inbox_wait = on_inbox_wait  # called on this thread: seconds from submit to acceptance
        self._holding_s: Callable[[], float] = getattr(engine, "holding_s", _no_hold)
        # The CUDA device is per host thread: the engine thread steps on the one its builder chose
        # (a stage on GPU 1 would otherwise make its streams and graphs on GPU 0).
        self._cuda_device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        self._held: Any = None  # a command the in-step drain met and left for the loop
        attach = getattr(engine, "attach_in_flight_drain", None)
        if attach is not None:
            attach(self._drain_in_step)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, request: Any, sink: ResponseSink) -> None:
        self._commands.put((self._submit, (request, sink, time.perf_counter())))

    def stop_request(self, request_id: str) -> None:
        self._commands.put((self.engine.stop, (request_id,)))

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the engine thread (for state the engine thread owns)."""
        self._commands.put((fn, args))

    def is_alive(self) -> bool:
        """False once the thread has ended (shutdown, or an error outside the contained paths)."""
        return self._thread.is_alive()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._commands.put(_STOP)
        self._thread.join(timeout_s)

    def _submit(self, request: Any, sink: ResponseSink, posted: float) -> None:
        if self._on_inbox_wait is not None:
            self._run_command((self._on_inbox_wait, (time.perf_counter() - posted,)))
        try:
            self.engine.submit(request, sink)
        except StageFailure as exc:
            sink.close(exc.error)
        except Exception as exc:  # contain: one bad request must not stop the engine
            self._on_error(f"submit of {getattr(request, 'request_id', '?')} failed: {exc!r}")
            sink.close(StageError("internal", f"{type(exc).__name__}: {exc}"))

    def _run(self) -> None:
        if self._cuda_device is not None:
            torch.cuda.set_device(self._cuda_device)
        while True:
            command, self._held = self._held, None
            if command is None:
                command = self._next_command(*self._wait())
            while command is not None:
                if command is _STOP:
                    return
                self._run_command(command)
                command = self._next_command(block=False)
            if self.engine.has_work():
                self._step()
            if self._observer is not None:
                self._run_command((self._observer, ()))

    def _drain_in_step(self) -> None:
        """Run the commands posted so far, from inside the engine's step (same thread)."""
        while self._held is None:
            command = self._next_command(block=False)
            if command is None:
                return
            if command is _STOP:
                self._held = command
            else:
                self._run_command(command)

    def _wait(self) -> tuple[bool, float | None]:
        """(block, timeout) of the next wait for a command: none while a step is due."""
        if not self.engine.has_work():
            return True, None
        try:
            hold = self._holding_s()
        except Exception as exc:  # an engine bug must not stop the thread: step instead
            self._on_error(f"engine holding_s failed: {exc!r}")
            hold = 0.0
        return (True, hold) if hold > 0.0 else (False, None)

    def _next_command(self, block: bool, timeout: float | None = None) -> Any:
        try:
            return self._commands.get(block=block, timeout=timeout)
        except queue.Empty:
            return None

    def _run_command(self, command: Any) -> None:
        fn, args = command
        try:
            fn(*args)
        except Exception as exc:
            self._on_error(f"engine command {getattr(fn, '__name__', fn)} failed: {exc!r}")

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            self.engine.step()
        except Exception as exc:  # engines contain per-request faults; this is an engine bug
            self._on_error(f"engine step failed: {exc!r}")
            abort_all = getattr(self.engine, "abort_all", None)
            if abort_all is not None:
                abort_all(StageError("internal", f"engine step failed: {type(exc).__name__}: {exc}"))
        if self._on_step is not None:
            self._run_command((self._on_step, (time.perf_counter() - started,)))
