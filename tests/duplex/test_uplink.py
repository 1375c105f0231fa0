"""parse_uplink: every bad input of docs/duplex_contract.md (#uplink-every-request, #errors) is
refused with a clear `invalid_argument` message, and good input is passed through unchanged."""
import json

import numpy as np
import pytest

from backends.duplex.errors import DuplexError
from backends.duplex.uplink import (
    MAX_REPLY_TOKENS_PER_UNIT, MAX_SEED, MAX_SETUP_TEXT_BYTES, RawUplink, parse_uplink,
)

MAX = 16000 * 10


def _raw(start=False, audio=None, ref=None, **params):
    return RawUplink("s1", start, False, audio, ref, json.dumps(params))


def test_start_with_options_and_ref_audio():
    up = parse_uplink(_raw(True, np.zeros(3200, np.int16), np.full(1600, 16384, np.int16),
                           initial_user_text="hi", temperature=0.7, seed=3, reply_units=4,
                           reply_tokens_per_unit=2), MAX)
    assert up.is_start and up.action == "append" and up.audio.size == 3200
    assert up.options.initial_user_text == "hi" and up.options.seed == 3 and up.options.reply_units == 4
    assert up.options.ref_audio.dtype == np.float32 and up.options.ref_audio.max() == 0.5


@pytest.mark.parametrize("raw,match", [
    (_raw(audio=np.zeros(10, np.float32)), "INT16"),
    (_raw(audio=np.zeros((2, 5), np.int16)), "rank 1"),
    (_raw(audio=np.zeros(MAX + 1, np.int16)), "over the limit"),
    (_raw(sample_rate=24000), "sample_rate must be 16000"),
    (_raw(sample_rate="16000"), "sample_rate must be 16000"),
    (_raw(action="explode"), "unknown action"),
    (_raw(action=3), "unknown action"),
    (_raw(temperature=0.5), "START only"),
    (_raw(True, temperature="hot"), "wrong type"),
    (_raw(True, temperature=9.0), r"\[0, 2\]"),
    (_raw(True, seed=True), "wrong type"),
    (_raw(True, reply_units=1000), "reply_units"),
    (_raw(True, initial_user_text="x" * 5000), "longer than"),
    (_raw(True, bogus=1), "unknown request parameter"),
    (_raw(ref=np.zeros(10, np.int16)), "START request only"),
    (_raw(True, ref=np.zeros(1599, np.int16)), "under the minimum of 1600"),
    (_raw(True, ref=np.zeros(1600, np.float32)), "REF_AUDIO must be INT16"),
    (_raw(True, ref=np.zeros((2, 1600), np.int16)), "REF_AUDIO must have rank 1"),
    (_raw(True, ref=np.zeros(30 * 16000 + 1, np.int16)), "REF_AUDIO holds"),
    (RawUplink("s1", False, False, None, None, "{not json"), "not valid JSON"),
    (RawUplink("s1", False, False, None, None, "[1, 2]"), "JSON object"),
])
def test_bad_input_is_refused(raw, match):
    with pytest.raises(DuplexError, match=match) as info:
        parse_uplink(raw, MAX)
    assert info.value.code == "invalid_argument"


def test_triton_parameters_are_ignored_and_empty_audio_is_fine():
    raw = RawUplink("s1", False, True, None, None, json.dumps({"triton_enable_empty_final_response": True}))
    up = parse_uplink(raw, MAX)
    assert up.is_end and up.audio.size == 0 and up.options is None


@pytest.mark.parametrize("params,match", [
    (dict(seed=MAX_SEED + 1), rf"parameter seed must be an integer in \[0, {MAX_SEED}\]"),
    (dict(seed=2**63 - 1), r"parameter seed .*\[0, "),
    (dict(seed=2**64), r"parameter seed .*\[0, "),
    (dict(seed=-1), r"parameter seed .*\[0, "),
    (dict(seed=1.5), "parameter seed has the wrong type"),
    (dict(temperature=-0.1), r"temperature must be in \[0, 2\] \(0: greedy\)"),
    (dict(temperature=float("nan")), r"temperature must be in \[0, 2\]"),
    (dict(temperature=float("inf")), r"temperature must be in \[0, 2\]"),
    (dict(top_k=0), r"top_k must be an integer in \[1, 1000\]"),
    (dict(top_k=2.0), "parameter top_k has the wrong type"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(max_new_speak_tokens_per_chunk=1), r"max_new_speak_tokens_per_chunk must be an integer in \[2, 32\]"),
    (dict(max_new_speak_tokens_per_chunk=33), r"max_new_speak_tokens_per_chunk must be an integer in \[2, 32\]"),
    (dict(listen_prob_scale=0), r"listen_prob_scale must be in \(0, 10\]"),
    (dict(length_penalty=0), r"length_penalty must be in \(0, 10\]"),
    (dict(max_kv_tokens=511), r"max_kv_tokens must be an integer in \[512, 1048576\]"),
    (dict(max_kv_tokens=2048.0), "parameter max_kv_tokens has the wrong type"),
    (dict(max_reply_tokens=0), r"max_reply_tokens must be an integer in \[1, 100000\]"),
    (dict(tts_enabled=0), "parameter tts_enabled has the wrong type"),
    (dict(text_repetition_penalty=float("nan")), r"text_repetition_penalty must be in \(0, 2\]"),
    (dict(text_repetition_window_size=0), r"text_repetition_window_size must be an integer in \[1, 8192\]"),
    (dict(listen_when_silent=1), "parameter listen_when_silent has the wrong type"),
    (dict(reply_units=1, reply_tokens_per_unit=5, max_new_speak_tokens_per_chunk=7),
     r"reply_tokens_per_unit must be at most 4 \(max_new_speak_tokens_per_chunk - 3\)"),
    (dict(reply_units=65, reply_tokens_per_unit=2), r"reply_units must be an integer in \[0, 64\]"),
    (dict(reply_units=2, reply_tokens_per_unit=MAX_REPLY_TOKENS_PER_UNIT + 1),
     rf"reply_tokens_per_unit must be an integer in \[0, {MAX_REPLY_TOKENS_PER_UNIT}\]"),
    (dict(reply_units=2), "reply_units and reply_tokens_per_unit must be set together"),
    (dict(reply_tokens_per_unit=3), "reply_units and reply_tokens_per_unit must be set together"),
    (dict(force_listen_count=1001), r"force_listen_count must be an integer in \[0, 1000\]"),
    (dict(force_listen_count=-1), r"force_listen_count must be an integer in \[0, 1000\]"),
    (dict(voice="alloy"), "parameter voice only 'default' or REF_AUDIO"),
    (dict(instructions="x" * 4001), "parameter instructions is longer than 4000 characters"),
    (dict(instructions="ü" * 2049), r"instructions and initial_user_text hold 4098 bytes .* limit of 4096"),
    (dict(instructions="x" * 3000, initial_user_text="y" * 1097), "hold 4097 bytes"),
])
def test_start_parameters_out_of_range_name_the_parameter_and_range(params, match):
    with pytest.raises(DuplexError, match=match) as info:
        parse_uplink(_raw(True, **params), MAX)
    assert info.value.code == "invalid_argument"


def test_start_parameters_at_their_limits_are_accepted():
    options = parse_uplink(_raw(True, seed=MAX_SEED, temperature=2, reply_units=64,
                                reply_tokens_per_unit=MAX_REPLY_TOKENS_PER_UNIT, force_listen_count=1000,
                                voice="default", instructions="x" * 3000, initial_user_text="y" * 1096), MAX).options
    assert options.seed == MAX_SEED and options.temperature == 2.0 and options.reply_units == 64
    assert len(options.instructions.encode()) + len(options.initial_user_text.encode()) == MAX_SETUP_TEXT_BYTES


def test_decoding_defaults_are_the_official_ones():
    """Unset decoding settings travel as < 0 (the Thinker's official defaults); the session
    forces its first 3 units to listen, as the official DuplexConfig does."""
    options = parse_uplink(_raw(True), MAX).options
    assert options.force_listen_count == 3
    unset = (options.temperature, options.top_k, options.top_p, options.max_new_speak_tokens_per_chunk,
             options.listen_prob_scale, options.length_penalty, options.text_repetition_penalty,
             options.text_repetition_window_size, options.listen_when_silent)
    assert all(value < 0 for value in unset), unset


def test_decoding_settings_are_carried_as_given():
    options = parse_uplink(_raw(True, temperature=0, top_k=5, top_p=1, max_new_speak_tokens_per_chunk=32,
                                listen_prob_scale=2, length_penalty=1, text_repetition_penalty=1,
                                text_repetition_window_size=64, listen_when_silent=True, force_listen_count=0),
                           MAX).options
    assert (options.temperature, options.top_k, options.top_p) == (0.0, 5, 1.0)
    assert isinstance(options.top_p, float) and isinstance(options.listen_prob_scale, float)
    assert (options.max_new_speak_tokens_per_chunk, options.listen_prob_scale) == (32, 2.0)
    assert isinstance(options.length_penalty, float) and options.length_penalty == 1.0
    assert (options.text_repetition_penalty, options.text_repetition_window_size) == (1.0, 64)
    assert options.listen_when_silent == 1 and options.force_listen_count == 0


def test_a_shaped_reply_is_not_forced_to_listen_unless_asked():
    """The reply-shape knob places its reply itself: its sessions default to no forced listens."""
    knob = dict(reply_units=1, reply_tokens_per_unit=2)
    assert parse_uplink(_raw(True, **knob), MAX).options.force_listen_count == 0
    assert parse_uplink(_raw(True, force_listen_count=2, **knob), MAX).options.force_listen_count == 2


def test_the_largest_seed_survives_what_the_orchestrator_adds():
    """The Talker's +42 and a Thinker epoch far past any session's barge-ins still fit int64."""
    for offset in (42, 10**6):
        assert np.array([MAX_SEED + offset], np.int64)[0] == MAX_SEED + offset


def test_the_reply_token_limit_is_the_thinkers():
    """What START accepts, the Thinker's policy accepts: a larger value fails only there."""
    from backends.thinker.policy_config import PolicyConfig

    PolicyConfig(reply_units=1, reply_tokens_per_unit=MAX_REPLY_TOKENS_PER_UNIT)
    with pytest.raises(ValueError):
        PolicyConfig(reply_units=1, reply_tokens_per_unit=MAX_REPLY_TOKENS_PER_UNIT + 1)


def test_the_decoding_settings_travel_on_every_thinker_request():
    """The setup carries them (the Thinker reads seq 0's) and so does every later append."""
    from backends.duplex.responses import EpochIds
    from backends.duplex.unit_queue import setup_request

    options = parse_uplink(_raw(True, temperature=0, top_k=7, top_p=0.5, max_new_speak_tokens_per_chunk=12,
                                listen_prob_scale=1.5, length_penalty=0.9, text_repetition_penalty=1.2,
                                text_repetition_window_size=99, listen_when_silent=False, max_kv_tokens=2048,
                                sliding_window_mode="basic", max_reply_tokens=40, tts_enabled=False), MAX).options
    request = setup_request(EpochIds("s", 0), options)
    assert (request.max_kv_tokens, request.sliding_window_mode, request.max_reply_tokens) == (2048, "basic", 40)
    assert options.tts_enabled is False
    assert (request.temperature, request.top_k, request.top_p) == (0.0, 7, 0.5)
    assert (request.max_new_speak_tokens_per_chunk, request.listen_prob_scale, request.length_penalty) == (12, 1.5, 0.9)
    assert (request.text_repetition_penalty, request.text_repetition_window_size) == (1.2, 99)
    assert request.listen_when_silent == 0
