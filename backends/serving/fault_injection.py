"""A test-only fault inside a stage: one marked request raises while the engine processes it.

Enabled by the configuration variable `fault_injection` (`off` by default, `on` in the
reliability test server); with it off no hook is installed and nothing is checked. When on, a
request whose id contains `fault-<stage>` (stage request ids are `<session_id>.e<epoch>`, so a
session id such as `rel-fault-talker-1` marks all of its requests for the talker) raises
`InjectedFault` at the engine's per-request step point: the thinker when it prepares the
session's next rows, the talker when it handles the session's sampled frame, code2wav when it
prepares the session's window. The engine's own containment must then end that request only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SETTINGS = ("off", "on")
MARKER_PREFIX = "fault-"


class InjectedFault(RuntimeError):
    """The exception a marked request raises; never seen with fault_injection=off."""


def fault_marker(stage: str) -> str:
    """The text a session id must contain to make `stage` fail its requests."""
    return f"{MARKER_PREFIX}{stage}"


@dataclass(frozen=True, slots=True)
class FaultHook:
    """Called by an engine with a request id at its per-request fault point."""

    stage: str

    def __call__(self, request_id: str) -> None:
        if fault_marker(self.stage) in request_id:
            raise InjectedFault(f"injected fault in {self.stage} for request {request_id!r} (fault_injection=on)")


def install_fault_hook(engine: Any, stage: str, setting: str) -> bool:
    """Give `engine` (or the engine a service wraps) a FaultHook when `setting` is `on`."""
    if setting not in SETTINGS:
        raise ValueError(f"fault_injection must be one of {SETTINGS}, got {setting!r}")
    if setting == "off":
        return False
    target = getattr(engine, "engine", engine)  # Code2WavService wraps its Code2WavEngine
    if not hasattr(target, "fault_hook"):
        raise ValueError(f"the {stage} engine {type(target).__name__} has no fault_hook attribute")
    target.fault_hook = FaultHook(stage)
    return True
