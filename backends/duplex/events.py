"""Server events on the downlink: one JSON object per response (OpenAI-Realtime-style names)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

SESSION_CREATED = "session.created"
RESPONSE_CREATED = "response.created"
RESPONSE_SPEAK = "response.speak"
RESPONSE_LISTEN = "response.listen"
RESPONSE_TEXT_DELTA = "response.text.delta"
RESPONSE_AUDIO_DELTA = "response.audio.delta"
RESPONSE_DONE = "response.done"
ERROR = "error"
SESSION_CLOSED = "session.closed"
DOWNLINK_MOVED = "downlink.moved"  # the last event of a request whose downlink moved on

STATUS_COMPLETED = "completed"
STATUS_CANCELLED = "cancelled"
STATUS_FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ServerEvent:
    type: str
    session_id: str
    fields: dict[str, Any]
    audio: np.ndarray | None = None  # [samples] int16 24 kHz, only for response.audio.delta

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "session_id": self.session_id, **self.fields}, ensure_ascii=False)
