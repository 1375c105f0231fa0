"""One assistant response (a model turn) as the client sees it, and its timing."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

OUTPUT_SAMPLE_RATE = 24000


@dataclass(slots=True)
class ResponseState:
    response_id: str
    turn_id: int
    trigger_time: float  # monotonic s: acceptance of the unit that triggered the reply
    first_text_time: float | None = None
    audio_samples: int = 0  # 24 kHz samples sent so far
    pending_text: str = ""  # unit text not yet attached to an audio delta
    done: bool = False
    units: int = 0

    @staticmethod
    def new(session_id: str, epoch: int, turn_id: int, trigger_time: float) -> "ResponseState":
        return ResponseState(f"resp-{session_id}-{epoch}-{secrets.token_hex(4)}", turn_id, trigger_time)

    @property
    def audio_ms(self) -> float:
        return 1000.0 * self.audio_samples / OUTPUT_SAMPLE_RATE


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """[n] float32 in [-1, 1] -> [n] int16 (clipped)."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


@dataclass(frozen=True, slots=True)
class SpeakWork:
    """A speak unit handed from the Thinker loop to the audio-tail loop."""

    epoch: int
    response: ResponseState
    token_ids: np.ndarray  # [m] int32
    hidden: np.ndarray  # [m, llm_hidden] float32
    text: str
    turn_start: bool  # first unit of the response: the Talker prompt is replaced
    turn_end: bool


@dataclass(frozen=True, slots=True)
class UnitWork:
    epoch: int
    samples: np.ndarray  # [16000] float32
    accepted: float  # monotonic s
    force_listen: bool = False


@dataclass(slots=True)
class EpochIds:
    """Stage request ids of one epoch: a barge-in starts fresh ones."""

    session_id: str
    epoch: int
    next_seq: int = 0
    next_condition_seq: int = 0
    cache_epoch: int = 0
    chunk_seq: int = 0
    started: set[str] = field(default_factory=set)  # stages with a live request

    @property
    def request_id(self) -> str:
        return f"{self.session_id}.e{self.epoch}"
