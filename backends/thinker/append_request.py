"""What the Thinker accepts in a `ThinkerRequest`: the append itself, and the session settings
its first append (seq 0) carries. Every failure is a StageFailure `invalid_argument`, answered
on that request's sink before any state changes.
"""

from __future__ import annotations

import numpy as np

from backends.contracts.errors import StageFailure
from backends.contracts.messages import ACTION_RUN, ThinkerRequest
from backends.thinker.context_window import WINDOW_MODES
from backends.thinker.policy_config import PolicyConfig
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


# ThinkerRequest field -> PolicyConfig field, for the settings where < 0 means the default
_DECODING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "max_new_speak_tokens_per_chunk": "max_tokens_per_unit",
    "listen_prob_scale": "listen_prob_scale",
    "length_penalty": "length_penalty",
    "text_repetition_penalty": "repetition_penalty",
    "text_repetition_window_size": "penalty_window",
}


def policy_config(first: ThinkerRequest, listen_when_silent: bool = False) -> PolicyConfig:
    """The session's policy: a negative decoding setting means the official default;
    `listen_when_silent` is the engine's default for the option the request leaves unset."""
    settings = {ours: getattr(first, field) for field, ours in _DECODING_FIELDS.items()
                if getattr(first, field) >= 0}
    silent = listen_when_silent if first.listen_when_silent < 0 else bool(first.listen_when_silent)
    try:
        return PolicyConfig(
            **settings,
            listen_when_silent=silent,
            max_reply_tokens=first.max_reply_tokens,
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
