"""What a client message asks of its session, whatever the protocol: the codecs parse messages
into these, the session bridge carries them out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Init:
    """Open the duplex session: START parameters (docs/duplex_contract.md), a reference voice,
    and the client's fields that no START parameter carries yet (reported back, not dropped)."""

    params: dict[str, Any]
    ref_audio: np.ndarray | None = None
    not_applied: tuple[str, ...] = ()


@dataclass(frozen=True)
class Append:
    pcm16: np.ndarray
    interrupt: bool = False  # barge-in: the open reply ends, this audio starts the next epoch


@dataclass(frozen=True)
class Close:
    reason: str = "client"


@dataclass(frozen=True)
class Pause:
    pass


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Ignore:
    """A message the protocol defines that needs nothing of the session (diagnostics)."""


Command = Init | Append | Close | Pause | Resume | Ignore


@dataclass
class Message:
    """A parsed client message's command and its size in bytes (for metrics)."""

    command: Command
    size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
