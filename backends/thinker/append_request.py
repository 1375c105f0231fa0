"""What the Thinker accepts in a `ThinkerRequest`: the append itself, and the session settings
its first append (seq 0) carries. Every failure is a StageFailure `invalid_argument`, answered
on that request's sink before any state changes.
"""

from __future__ import annotations

import numpy as np

from backends.contracts.errors import StageFailure
from backends.contracts.messages import ACTION_RUN, ThinkerRequest
from backends.thinker.context_window import WINDOW_MODES
from backends.thinker.duplex_policy import DEFAULT_TEMPERATURE, PolicyConfig
from backends.thinker.prompt_layout import UNIT_SAMPLES


def check_append(request: ThinkerRequest) -> None:
    """A run action with whole 1-second units of 1-D float32 audio; the first append (seq 0)
    may hold none: it sets the session up and prefills its system context only."""
    if request.action != ACTION_RUN:
        raise StageFailure("invalid_argument", f"unknown action {request.action!r}")
    audio = request.audio
    if not isinstance(audio, np.ndarray) or audio.ndim != 1 or audio.dtype != np.float32:
        raise StageFailure("invalid_argument", "audio must be a 1-D float32 array")
    if audio.size % UNIT_SAMPLES or (audio.size == 0 and request.seq != 0):
        raise StageFailure(
            "invalid_argument",
            f"audio must hold whole units of {UNIT_SAMPLES} samples (none only on the setup "
            f"append, seq 0), got {audio.size} at seq {request.seq}",
        )


def policy_config(first: ThinkerRequest) -> PolicyConfig:
    """The session's policy: a negative temperature means the default (0.7)."""
    temperature = first.temperature if first.temperature >= 0 else DEFAULT_TEMPERATURE
    try:
        return PolicyConfig(
            temperature=temperature,
            reply_units=first.reply_units,
            reply_tokens_per_unit=first.reply_tokens_per_unit,
        )
    except ValueError as err:
        raise StageFailure("invalid_argument", str(err)) from err


def window_mode(first: ThinkerRequest, default: str) -> str:
    """The session's `sliding_window_mode`; empty means the engine's default."""
    mode = first.sliding_window_mode or default
    if mode not in WINDOW_MODES:
        raise StageFailure(
            "invalid_argument",
            f"sliding_window_mode {mode!r} is not one of {list(WINDOW_MODES)}",
        )
    return mode
