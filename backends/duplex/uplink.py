"""Validate one uplink request of the `duplex` model (docs/duplex_contract.md#uplink-every-request).

Everything a client controls is checked here, before any state changes: dtype and rank of
AUDIO/REF_AUDIO, append size, the sample_rate parameter, the action, and the type and range
of every session parameter, each to what the stages can hold (a value that passed here must not
fail the session later). A failure is a DuplexError with code `invalid_argument` that names the
parameter and what it accepts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.contracts.messages import MAX_REF_AUDIO_SECONDS, MIN_REF_AUDIO_SAMPLES
from backends.duplex.errors import INVALID_ARGUMENT, DuplexError
from backends.duplex.unit_buffer import SAMPLE_RATE
from backends.thinker.context_window import WINDOW_MODES
from backends.thinker.policy_config import MAX_TOKENS_PER_UNIT, REPLY_CONTROL_SLOTS, TOKENS_PER_UNIT_LIMIT

MOVE_DOWNLINK = "move_downlink"  # this request carries the downlink from now on (downlink.py)
ACTIONS = ("append", "commit", "cancel", MOVE_DOWNLINK)
MAX_TEXT_CHARS = 4000
# instructions + initial_user_text as UTF-8: at most half the Thinker's default context of 8192
# tokens (a token is at least one byte), so the setup leaves room for the conversation.
MAX_SETUP_TEXT_BYTES = 4096
# The orchestrator adds to the session's seed before it travels as int64: 42 for the Talker
# (backends/duplex/audio_tail.py) and the epoch, one per barge-in, for the Thinker
# (backends/duplex/unit_queue.py). The headroom would take 2**32 - 42 barge-ins to use up.
SEED_HEADROOM = 2**32
MAX_SEED = 2**63 - 1 - SEED_HEADROOM
MAX_REPLY_UNITS = 64
# The Thinker's limit (backends/thinker/duplex_policy.py): a forced unit's text tokens plus its control tokens.
MAX_REPLY_TOKENS_PER_UNIT = MAX_TOKENS_PER_UNIT - REPLY_CONTROL_SLOTS
MAX_FORCE_LISTEN_COUNT = 1000
DEFAULT_FORCE_LISTEN_COUNT = 3  # the official DuplexConfig's
MAX_SPEAK_TOKENS_PER_CHUNK = TOKENS_PER_UNIT_LIMIT  # the Thinker's (backends/thinker/duplex_policy.py)
MAX_TOP_K = 1000
MAX_PENALTY_WINDOW = 8192
# A session's own Thinker KV limit (`max_kv_tokens`): room for the setup and a few units at
# least; above the server's reservation (`max_context_tokens`) the reservation is the limit.
MIN_KV_TOKENS, MAX_KV_TOKENS = 512, 1 << 20
MAX_REPLY_TOKENS = 100_000
VOICES = ("", "default")


@dataclass(frozen=True, slots=True)
class RawUplink:
    """What the server hands over, before validation."""

    session_id: str
    is_start: bool
    is_end: bool
    audio: np.ndarray | None  # AUDIO as received (any dtype/shape), None when absent
    ref_audio: np.ndarray | None  # REF_AUDIO as received
    parameters: str  # request parameters as a JSON object string


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Set on START only."""

    instructions: str = ""
    initial_user_text: str = ""
    temperature: float = -1.0  # < 0: the policy default
    seed: int = 0
    reply_units: int = 0
    reply_tokens_per_unit: int = 0
    force_listen_count: int = DEFAULT_FORCE_LISTEN_COUNT
    # the official decoding settings; < 0: the official default (backends/thinker/duplex_policy.py)
    top_k: int = -1
    top_p: float = -1.0
    max_new_speak_tokens_per_chunk: int = -1
    listen_prob_scale: float = -1.0
    length_penalty: float = -1.0
    text_repetition_penalty: float = -1.0
    text_repetition_window_size: int = -1
    listen_when_silent: int = -1  # option: 1 on, 0 off, < 0 the Thinker's default
    sliding_window_mode: str = ""  # off | basic | context; "" = the Thinker's default (off)
    max_kv_tokens: int = 0  # the session's Thinker KV limit; 0: the server's reservation
    tts_enabled: bool = True  # False: replies are text only (no Talker, no Code2Wav)
    max_reply_tokens: int = 0  # option: a reply ends after this many text tokens (0 = off)
    ref_audio: np.ndarray | None = None  # [n] float32 16 kHz


@dataclass(frozen=True, slots=True)
class Uplink:
    session_id: str
    is_start: bool
    is_end: bool
    action: str
    audio: np.ndarray  # [n] int16 16 kHz
    options: SessionOptions | None  # START only


# name -> (accepted python types, validator returning an error or None)
_START_PARAMS: dict[str, tuple[tuple[type, ...], Any]] = {
    "instructions": ((str,), lambda v: _text_limit(v)),
    "initial_user_text": ((str,), lambda v: _text_limit(v)),
    "temperature": ((int, float), lambda v: None if 0.0 <= v <= 2.0 else f"must be in [0, 2] (0: greedy), got {v!r}"),
    "top_k": ((int,), lambda v: _int_range(v, 1, MAX_TOP_K)),
    "top_p": ((int, float), lambda v: None if 0.0 < v <= 1.0 else f"must be in (0, 1], got {v!r}"),
    "max_new_speak_tokens_per_chunk": ((int,), lambda v: _int_range(v, 2, MAX_SPEAK_TOKENS_PER_CHUNK)),
    "listen_prob_scale": ((int, float), lambda v: None if 0.0 < v <= 10.0 else f"must be in (0, 10], got {v!r}"),
    "length_penalty": ((int, float), lambda v: None if 0.0 < v <= 10.0 else f"must be in (0, 10], got {v!r}"),
    "text_repetition_penalty": ((int, float), lambda v: None if 0.0 < v <= 2.0 else f"must be in (0, 2], got {v!r}"),
    "text_repetition_window_size": ((int,), lambda v: _int_range(v, 1, MAX_PENALTY_WINDOW)),
    "listen_when_silent": ((bool,), lambda v: None),
    "seed": ((int,), lambda v: _int_range(v, 0, MAX_SEED)),
    "reply_units": ((int,), lambda v: _int_range(v, 0, MAX_REPLY_UNITS)),
    "reply_tokens_per_unit": ((int,), lambda v: _int_range(v, 0, MAX_REPLY_TOKENS_PER_UNIT)),
    "force_listen_count": ((int,), lambda v: _int_range(v, 0, MAX_FORCE_LISTEN_COUNT)),
    "sliding_window_mode": ((str,), lambda v: None if v in WINDOW_MODES else f"must be one of {list(WINDOW_MODES)}"),
    "max_kv_tokens": ((int,), lambda v: _int_range(v, MIN_KV_TOKENS, MAX_KV_TOKENS)),
    "tts_enabled": ((bool,), lambda v: None),
    "max_reply_tokens": ((int,), lambda v: _int_range(v, 1, MAX_REPLY_TOKENS)),
    "voice": ((str,), lambda v: None if v in VOICES else "only 'default' or REF_AUDIO is supported"),
}
_ANY_PARAMS = ("action", "sample_rate")
_FLOAT_PARAMS = ("temperature", "top_p", "listen_prob_scale", "length_penalty", "text_repetition_penalty")


def _text_limit(value: str) -> str | None:
    return None if len(value) <= MAX_TEXT_CHARS else f"is longer than {MAX_TEXT_CHARS} characters"


def _int_range(value: int, low: int, high: int) -> str | None:
    return None if low <= value <= high else f"must be an integer in [{low}, {high}], got {value}"


def parse_uplink(raw: RawUplink, max_append_samples: int) -> Uplink:
    params = _parse_parameters(raw.parameters)
    _check_param_names(params, raw.is_start)
    _check_sample_rate(params)
    action = params.get("action", "append")
    if not isinstance(action, str) or action not in ACTIONS:
        raise DuplexError(INVALID_ARGUMENT, f"unknown action {action!r}; expected one of {list(ACTIONS)}")
    audio = _pcm16("AUDIO", raw.audio, max_append_samples)
    if action == MOVE_DOWNLINK and (raw.is_start or raw.is_end or audio.size):
        raise DuplexError(INVALID_ARGUMENT, f"action {MOVE_DOWNLINK} takes no audio and neither START nor END "
                                            "(the request becomes the session's downlink)")
    options = _session_options(params, raw.ref_audio) if raw.is_start else None
    if raw.ref_audio is not None and not raw.is_start:
        raise DuplexError(INVALID_ARGUMENT, "REF_AUDIO is accepted on the START request only")
    return Uplink(raw.session_id, raw.is_start, raw.is_end, action, audio, options)


def _parse_parameters(text: str) -> dict[str, Any]:
    try:
        params = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise DuplexError(INVALID_ARGUMENT, f"request parameters are not valid JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise DuplexError(INVALID_ARGUMENT, "request parameters must be a JSON object")
    # Triton may forward its own `triton_*` keys; they are not ours to judge.
    return {k: v for k, v in params.items() if not k.startswith("triton_")}


def _check_param_names(params: dict[str, Any], is_start: bool) -> None:
    allowed = set(_ANY_PARAMS) | (set(_START_PARAMS) if is_start else set())
    unknown = sorted(set(params) - allowed)
    if unknown:
        where = "" if is_start else " (session parameters are accepted on START only)"
        raise DuplexError(INVALID_ARGUMENT, f"unknown request parameter(s) {unknown}{where}")


def _check_sample_rate(params: dict[str, Any]) -> None:
    rate = params.get("sample_rate", SAMPLE_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int) or rate != SAMPLE_RATE:
        raise DuplexError(INVALID_ARGUMENT, f"sample_rate must be {SAMPLE_RATE} (resampling is the client's job), got {rate!r}")


def _pcm16(name: str, array: np.ndarray | None, max_samples: int) -> np.ndarray:
    if array is None:
        return np.zeros((0,), dtype=np.int16)
    if array.dtype != np.int16:
        raise DuplexError(INVALID_ARGUMENT, f"{name} must be INT16 PCM, got {array.dtype.name}")
    if array.ndim != 1:
        raise DuplexError(INVALID_ARGUMENT, f"{name} must have rank 1, got shape {list(array.shape)}")
    if array.size > max_samples:
        raise DuplexError(INVALID_ARGUMENT, f"{name} holds {array.size} samples, over the limit of {max_samples} "
                                            f"({max_samples / SAMPLE_RATE:.1f} s) per request")
    return array


def _check_together(values: dict[str, Any]) -> None:
    """Rules across START parameters: the reply-shape knobs come as a pair, and the setup texts
    share one size limit."""
    if (values.get("reply_units", 0) > 0) != (values.get("reply_tokens_per_unit", 0) > 0):
        raise DuplexError(INVALID_ARGUMENT, "parameters reply_units and reply_tokens_per_unit must be set together "
                                            "(both 0, or both at least 1)")
    budget = values.get("max_new_speak_tokens_per_chunk", MAX_TOKENS_PER_UNIT) - REPLY_CONTROL_SLOTS
    if values.get("reply_tokens_per_unit", 0) > budget:
        raise DuplexError(INVALID_ARGUMENT, f"parameter reply_tokens_per_unit must be at most {budget} "
                                            "(max_new_speak_tokens_per_chunk - 3)")
    texts = (values.get("instructions", ""), values.get("initial_user_text", ""))
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    if size > MAX_SETUP_TEXT_BYTES:
        raise DuplexError(INVALID_ARGUMENT, f"parameters instructions and initial_user_text hold {size} bytes of "
                                            f"UTF-8 together, over the limit of {MAX_SETUP_TEXT_BYTES}")


def _session_options(params: dict[str, Any], ref_audio: np.ndarray | None) -> SessionOptions:
    values: dict[str, Any] = {}
    for name, (types, check) in _START_PARAMS.items():
        if name not in params:
            continue
        value = params[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise DuplexError(INVALID_ARGUMENT, f"parameter {name} has the wrong type {type(value).__name__}")
        problem = check(value)
        if problem:
            raise DuplexError(INVALID_ARGUMENT, f"parameter {name} {problem}")
        values[name] = float(value) if name in _FLOAT_PARAMS else value
    _check_together(values)
    values.pop("voice", None)
    if "listen_when_silent" in values:
        values["listen_when_silent"] = int(values["listen_when_silent"])
    if "force_listen_count" not in values and values.get("reply_units", 0) > 0:
        values["force_listen_count"] = 0  # a shaped reply starts where the knob says
    ref = _pcm16("REF_AUDIO", ref_audio, MAX_REF_AUDIO_SECONDS * SAMPLE_RATE) if ref_audio is not None else None
    if ref is not None and 0 < ref.size < MIN_REF_AUDIO_SAMPLES:
        raise DuplexError(INVALID_ARGUMENT, f"REF_AUDIO holds {ref.size} samples, under the minimum of "
                                            f"{MIN_REF_AUDIO_SAMPLES} ({MIN_REF_AUDIO_SAMPLES / SAMPLE_RATE:.1f} s)")
    if ref is not None and ref.size:
        values["ref_audio"] = ref.astype(np.float32) / 32768.0
    return SessionOptions(**values)
