"""The client's session settings as START parameters of the duplex contract: the fields both
WebSocket protocols share (a system prompt, sampling temperature, reference voices). A field
with no START parameter yet is listed as not applied and told to the client when its session is
created (docs/gateway.md, "Session settings")."""
from __future__ import annotations

from typing import Any

import numpy as np

from backends.gateway.audio import AudioDecodeError, float32_base64_to_pcm16
from backends.gateway.errors import INVALID_AUDIO, INVALID_EVENT, GatewayError

# START parameters that take a boolean (the others a client config maps to are numbers)
FLAG_PARAMS = ("tts_enabled",)

# A START parameter travels as a Triton request parameter: a string, a bool, a float or an int64.
INT64_RANGE = (-2**63, 2**63 - 1)


def voice_audio(ref: object, tts_ref: object) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """REF_AUDIO from the reference voice (the Thinker hears it and replies are spoken from it);
    a separate TTS-only voice has no START input yet, so it applies only when it is the only one."""
    chosen, not_applied = ref or tts_ref, ()
    if ref and tts_ref and tts_ref != ref:
        not_applied = ("tts_ref_audio_base64",)
    if not chosen:
        return None, not_applied
    try:
        return float32_base64_to_pcm16(chosen), not_applied
    except AudioDecodeError as err:
        raise GatewayError(INVALID_AUDIO, f"reference voice: {err}") from None


def config_params(config: dict[str, Any], mapped: dict[str, str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The config fields named in `mapped` (client name -> START parameter) and the names of
    the others, which no START parameter carries today."""
    params, not_applied = {}, []
    for name, value in config.items():
        if value is None:
            continue
        if mapped.get(name) in FLAG_PARAMS:
            params[mapped[name]] = _flag(name, value)
        elif name in mapped:
            params[mapped[name]] = _number(name, value)
        else:
            not_applied.append(name)
    return params, tuple(not_applied)


def text_field(container: dict[str, Any], *names: str) -> str | None:
    for name in names:
        value = container.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise GatewayError(INVALID_EVENT, f"{name} must be a string")
        if "\x00" in value:  # Triton cuts a string parameter at its first NUL: refused rather than cut
            raise GatewayError(INVALID_EVENT, f"{name} must not contain NUL characters")
        return value or None
    return None


def object_field(container: dict[str, Any], name: str) -> dict[str, Any]:
    value = container.get(name) or {}
    if not isinstance(value, dict):
        raise GatewayError(INVALID_EVENT, f"{name} must be an object")
    return value


def start_params(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`values` as START parameters; a value no request parameter can carry (a list, an object,
    an integer past int64, a string with a NUL, which Triton would cut) is refused here rather
    than failing or changing on its way out."""
    for name, value in values.items():
        if not isinstance(value, (str, bool, int, float)):
            raise GatewayError(INVALID_EVENT, f"{prefix}{name} must be a string, a boolean or a number")
        if isinstance(value, str) and "\x00" in value:
            raise GatewayError(INVALID_EVENT, f"{prefix}{name} must not contain NUL characters")
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
            raise GatewayError(INVALID_EVENT, f"{prefix}{name} is out of range")
    return values


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise GatewayError(INVALID_EVENT, f"config.{name} must be a boolean")
    return value


def _number(name: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayError(INVALID_EVENT, f"config.{name} must be a number")
    return start_params({name: value}, "config.")[name]
