"""What a step of perf/fuzz_inputs.py should get, read from the client contract
(docs/duplex_contract.md) and written apart from the server's own validation
(backends/duplex/uplink.py), so that a check that is too lax or too strict shows up.

`expect(step, reused_id)` is one of: `OK` (an uplink request answered with an empty FINAL, or
a START answered with `session.created`), `ERROR` (a clear error: the request fails, or a
START is refused on its downlink), `FORBIDDEN` (a stage refuses the request with `[forbidden]`)
or `EITHER` (the contract allows both, e.g. a START for an id this run used before).
"""
from __future__ import annotations

from typing import Callable

from perf.fuzz_inputs import (MAX_APPEND_SAMPLES, MAX_REF_SAMPLES, MAX_SEED, MAX_SETUP_TEXT_BYTES, MAX_TEXT_CHARS,
                              MIN_REF_SAMPLES, SAMPLE_RATE, STAGES, Step, TensorSpec)

OK, ERROR, FORBIDDEN, EITHER = "ok", "error", "forbidden", "either"
ACTIONS = ("append", "commit", "cancel")


# The one `triton_` request parameter Triton passes on (and `duplex` ignores).
TRITON_PASSED_KEY = "triton_enable_empty_final_response"


def expect(step: Step, reused_id: bool = False) -> str:
    if step.target in STAGES:
        return OK if step.stage_request == "health" else FORBIDDEN
    if step.target == "unknown" or (step.target == "live" and step.start):
        return ERROR  # no START first, or a START for an open session (session_exists)
    if step.session_id in ("", 0) or (isinstance(step.session_id, str) and step.session_id.startswith("\x00")):
        return ERROR  # no correlation id (Triton reads a string id up to its first NUL): refused
    verdict = _request_verdict(step)
    if verdict == OK and step.start and reused_id:
        return EITHER  # the earlier session of this id may still be closing (session_exists)
    return verdict


def _request_verdict(step: Step) -> str:
    if not _tensors_valid(step.tensors, step.start):
        return ERROR
    if any(key.startswith("triton_") and key != TRITON_PASSED_KEY for key, _ in step.params):
        return ERROR  # reserved: Triton refuses the request before `duplex` sees it
    params = {key: value for key, value in step.params if key != TRITON_PASSED_KEY}
    return OK if _params_valid(params, step.start) else ERROR


def _tensors_valid(tensors: tuple[TensorSpec, ...], is_start: bool) -> bool:
    for spec in tensors:
        if spec.name not in ("AUDIO", "REF_AUDIO") or spec.dtype != "int16" or len(spec.shape) != 1:
            return False
        size = spec.shape[0]
        if spec.name == "AUDIO" and size > MAX_APPEND_SAMPLES:
            return False
        if spec.name == "REF_AUDIO" and (not is_start or not (size == 0 or MIN_REF_SAMPLES <= size <= MAX_REF_SAMPLES)):
            return False
    return True


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(low: int, high: int) -> Callable[[object], bool]:
    return lambda value: _is_int(value) and low <= value <= high


def _text(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT_CHARS


def _number(low: float, high: float, low_open: bool = True) -> Callable[[object], bool]:
    """A number (a bool is not one) in (low, high], or [low, high] with low_open False."""
    def check(value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return (low < value if low_open else low <= value) and value <= high
    return check


RULES: dict[str, Callable[[object], bool]] = {
    "action": lambda value: isinstance(value, str) and value in ACTIONS,
    "sample_rate": lambda value: _is_int(value) and value == SAMPLE_RATE,
}
START_RULES: dict[str, Callable[[object], bool]] = {
    "instructions": _text,
    "initial_user_text": _text,
    "temperature": _number(0.0, 2.0, low_open=False),
    "top_k": _in_range(1, 1000),
    "top_p": _number(0.0, 1.0),
    "max_new_speak_tokens_per_chunk": _in_range(2, 32),
    "listen_prob_scale": _number(0.0, 10.0),
    "length_penalty": _number(0.0, 10.0),
    "text_repetition_penalty": _number(0.0, 2.0),
    "text_repetition_window_size": _in_range(1, 8192),
    "listen_when_silent": lambda value: isinstance(value, bool),
    "seed": _in_range(0, MAX_SEED),
    "voice": lambda value: value in ("", "default") and isinstance(value, str),
    "reply_units": _in_range(0, 64),
    "reply_tokens_per_unit": _in_range(0, 17),
    "force_listen_count": _in_range(0, 1000),
    "sliding_window_mode": lambda value: isinstance(value, str) and value in ("off", "basic", "context"),
    "max_kv_tokens": _in_range(512, 1 << 20),
    "tts_enabled": lambda value: isinstance(value, bool),
    "max_reply_tokens": _in_range(1, 100_000),
}


def _params_valid(params: dict[str, object], is_start: bool) -> bool:
    rules = {**RULES, **START_RULES} if is_start else RULES
    if any(key not in rules or not rules[key](value) for key, value in params.items()):
        return False
    if not is_start:
        return True
    units, tokens = params.get("reply_units", 0), params.get("reply_tokens_per_unit", 0)
    if (units > 0) != (tokens > 0):
        return False
    if tokens > params.get("max_new_speak_tokens_per_chunk", 20) - 3:
        return False
    texts = (params.get("instructions", ""), params.get("initial_user_text", ""))
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts) <= MAX_SETUP_TEXT_BYTES
