"""What a protocol codec may read of its session when it builds messages: its id, the fields
its START did not apply, the usage so far, the unit clock. The session bridge owns and fills it."""
from __future__ import annotations

from dataclasses import dataclass, field

from backends.gateway.unit_clock import UnitClock
from backends.gateway.usage import Usage


@dataclass
class SessionContext:
    session_id: str
    usage: Usage = field(default_factory=Usage)
    clock: UnitClock = field(default_factory=UnitClock)
    not_applied: tuple[str, ...] = ()
    close_reason: str | None = None  # the client's reason, once it asked to close
