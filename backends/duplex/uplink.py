"""Validate one uplink request of the `duplex` model (docs/duplex_contract.md#uplink-every-request).

Everything a client controls is checked here, before any state changes: dtype and rank of
AUDIO/REF_AUDIO, append size, the sample_rate parameter, the action, and the type and range
of every session parameter. A failure is a DuplexError with code `invalid_argument`.
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

ACTIONS = ("append", "commit", "cancel")
MAX_TEXT_CHARS = 4000


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
    force_listen_count: int = 0
    sliding_window_mode: str = ""  # off | basic | context; "" = the Thinker's default (off)
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
    "temperature": ((int, float), lambda v: None if 0.0 < v <= 2.0 else "must be in (0, 2]"),
    "seed": ((int,), lambda v: None if 0 <= v < 2**63 else "must be a non-negative 63-bit integer"),
    "reply_units": ((int,), lambda v: None if 0 <= v <= 64 else "must be in [0, 64]"),
    "reply_tokens_per_unit": ((int,), lambda v: None if 0 <= v <= 19 else "must be in [0, 19]"),
    "force_listen_count": ((int,), lambda v: None if 0 <= v <= 1000 else "must be in [0, 1000]"),
    "sliding_window_mode": ((str,), lambda v: None if v in WINDOW_MODES else f"must be one of {list(WINDOW_MODES)}"),
    "voice": ((str,), lambda v: None if v in ("", "default") else "only 'default' or REF_AUDIO is supported"),
}
_ANY_PARAMS = ("action", "sample_rate")


def _text_limit(value: str) -> str | None:
    return None if len(value) <= MAX_TEXT_CHARS else f"is longer than {MAX_TEXT_CHARS} characters"


def parse_uplink(raw: RawUplink, max_append_samples: int) -> Uplink:
    params = _parse_parameters(raw.parameters)
    _check_param_names(params, raw.is_start)
    _check_sample_rate(params)
    action = params.get("action", "append")
    if not isinstance(action, str) or action not in ACTIONS:
        raise DuplexError(INVALID_ARGUMENT, f"unknown action {action!r}; expected one of {list(ACTIONS)}")
    audio = _pcm16("AUDIO", raw.audio, max_append_samples)
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


def _session_options(params: dict[str, Any], ref_audio: np.ndarray | None) -> SessionOptions:
    values: dict[str, Any] = {}
    for name, (types, check) in _START_PARAMS.items():
        if name not in params:
            continue
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise DuplexError(INVALID_ARGUMENT, f"parameter {name} has the wrong type {type(value).__name__}")
        problem = check(value)
        if problem:
            raise DuplexError(INVALID_ARGUMENT, f"parameter {name} {problem}")
        values[name] = float(value) if name == "temperature" else value
    values.pop("voice", None)
    ref = _pcm16("REF_AUDIO", ref_audio, MAX_REF_AUDIO_SECONDS * SAMPLE_RATE) if ref_audio is not None else None
    if ref is not None and 0 < ref.size < MIN_REF_AUDIO_SAMPLES:
        raise DuplexError(INVALID_ARGUMENT, f"REF_AUDIO holds {ref.size} samples, under the minimum of "
                                            f"{MIN_REF_AUDIO_SAMPLES} ({MIN_REF_AUDIO_SAMPLES / SAMPLE_RATE:.1f} s)")
    if ref is not None and ref.size:
        values["ref_audio"] = ref.astype(np.float32) / 32768.0
    return SessionOptions(**values)
