"""append_request: what a ThinkerRequest may carry; every refusal is `invalid_argument`.

Strategy: one request per rule, built from a valid one with a single field changed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.contracts.errors import StageFailure
from backends.contracts.messages import ThinkerRequest
from backends.thinker.append_request import check_append, policy_config, window_mode
from backends.thinker.policy_config import DEFAULT_TEMPERATURE

VALID = ThinkerRequest("r", np.zeros(32000, np.float32))


@pytest.mark.parametrize(("change", "match"), [
    ({"action": "explode"}, "unknown action 'explode'"),
    ({"audio": np.zeros(16000, np.float64)}, "1-D float32"),
    ({"audio": np.zeros((1, 16000), np.float32)}, "1-D float32"),
    ({"audio": np.zeros(0, np.float32), "seq": 1}, "got 0 at seq 1"),
    ({"audio": np.zeros(16001, np.float32)}, "got 16001 at seq 0"),
])
def test_bad_appends_are_refused(change: dict[str, object], match: str) -> None:
    with pytest.raises(StageFailure, match=match) as caught:
        check_append(dataclasses.replace(VALID, **change))
    assert caught.value.error.code == "invalid_argument"


def test_a_valid_append_passes() -> None:
    check_append(VALID)


def test_the_setup_append_alone_may_hold_no_audio() -> None:
    check_append(dataclasses.replace(VALID, audio=np.zeros(0, np.float32), seq=0))


def test_policy_settings() -> None:
    assert policy_config(VALID).temperature == DEFAULT_TEMPERATURE
    assert policy_config(dataclasses.replace(VALID, temperature=0.0)).temperature == 0.0
    knobs = policy_config(dataclasses.replace(VALID, reply_units=2, reply_tokens_per_unit=3))
    assert (knobs.reply_units, knobs.reply_tokens_per_unit) == (2, 3)
    with pytest.raises(StageFailure, match="reply_units and reply_tokens_per_unit") as caught:
        policy_config(dataclasses.replace(VALID, reply_units=2))
    assert caught.value.error.code == "invalid_argument"


def test_unset_decoding_settings_are_the_official_defaults() -> None:
    config = policy_config(VALID)
    assert (config.temperature, config.top_k, config.top_p) == (0.7, 20, 0.8)
    assert (config.max_tokens_per_unit, config.listen_prob_scale, config.length_penalty) == (20, 1.0, 1.1)
    assert (config.repetition_penalty, config.penalty_window) == (1.05, 512)
    assert config.max_chars_per_unit == 0 and not config.listen_when_silent and not config.has_reply_knobs
    assert config.max_reply_tokens == 0


def test_decoding_settings_travel_to_the_policy() -> None:
    request = dataclasses.replace(
        VALID, top_k=5, top_p=0.5, max_new_speak_tokens_per_chunk=9, listen_prob_scale=1.5, length_penalty=1.3,
        text_repetition_penalty=1.2, text_repetition_window_size=64, listen_when_silent=1, max_reply_tokens=30)
    config = policy_config(request)
    assert config.max_reply_tokens == 30
    assert (config.top_k, config.top_p, config.max_tokens_per_unit) == (5, 0.5, 9)
    assert (config.listen_prob_scale, config.repetition_penalty, config.penalty_window) == (1.5, 1.2, 64)
    assert config.listen_when_silent and config.length_penalty == 1.3


def test_the_silence_option_takes_the_engine_default_unless_set() -> None:
    assert policy_config(VALID, listen_when_silent=True).listen_when_silent
    off = dataclasses.replace(VALID, listen_when_silent=0)
    assert not policy_config(off, listen_when_silent=True).listen_when_silent


def test_window_mode_defaults_and_choices() -> None:
    assert window_mode(VALID, "off") == "off"
    assert window_mode(VALID, "basic") == "basic"
    chosen = dataclasses.replace(VALID, sliding_window_mode="context")
    assert window_mode(chosen, "off") == "context"
    with pytest.raises(StageFailure, match="'rolling' is not one of") as caught:
        window_mode(dataclasses.replace(VALID, sliding_window_mode="rolling"), "off")
    assert caught.value.error.code == "invalid_argument"


@pytest.mark.parametrize("change", [dict(top_p=float("inf")), dict(listen_prob_scale=float("inf")),
                                    dict(max_new_speak_tokens_per_chunk=33), dict(top_k=0)])
def test_unservable_decoding_settings_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(StageFailure) as info:
        policy_config(dataclasses.replace(VALID, **change))
    assert info.value.error.code == "invalid_argument"
