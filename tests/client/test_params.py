"""Tests for client/params.py: START parameters and their validation.

Strategy: the parameter dict is what goes on the wire, so it is compared literally.
"""

import pytest

from client.params import SessionParams


def test_unset_fields_are_left_out():
    assert SessionParams().to_parameters() == {}


def test_all_fields_with_wire_types():
    params = SessionParams(
        instructions="be brief", initial_user_text="hi", temperature=0.7, seed=3,
        reply_units=2, reply_tokens_per_unit=5, voice="default", force_listen_count=0,
    )
    assert params.to_parameters() == {
        "instructions": "be brief",
        "initial_user_text": "hi",
        "temperature": 0.7,
        "seed": 3,
        "reply_units": 2,
        "reply_tokens_per_unit": 5,
        "voice": "default",
        "force_listen_count": 0,  # zero is a value, not "unset"
    }


def test_int_temperature_travels_as_float():
    """tritonclient maps int to int64_param; the server reads temperature as a number."""
    assert SessionParams(temperature=1).to_parameters() == {"temperature": 1.0}
    assert isinstance(SessionParams(temperature=1).to_parameters()["temperature"], float)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"seed": -1}, "seed"),
        ({"reply_units": 0}, "reply_units"),
        ({"reply_tokens_per_unit": 0}, "reply_tokens_per_unit"),
        ({"force_listen_count": -1}, "force_listen_count"),
    ],
)
def test_invalid_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SessionParams(**kwargs)


def test_decoding_settings_with_wire_types():
    """The official decoding settings: ints stay ints, the fractional ones travel as floats,
    the silence option as a bool."""
    params = SessionParams(top_k=20, top_p=1, max_new_speak_tokens_per_chunk=20, listen_prob_scale=1,
                           text_repetition_penalty=1.05, text_repetition_window_size=512,
                           listen_when_silent=False)
    wire = params.to_parameters()
    assert wire == {"top_k": 20, "top_p": 1.0, "max_new_speak_tokens_per_chunk": 20, "listen_prob_scale": 1.0,
                    "text_repetition_penalty": 1.05, "text_repetition_window_size": 512,
                    "listen_when_silent": False}
    assert all(isinstance(wire[k], float) for k in ("top_p", "listen_prob_scale", "text_repetition_penalty"))


@pytest.mark.parametrize("kwargs", [dict(top_k=0), dict(top_p=0.0), dict(max_new_speak_tokens_per_chunk=1),
                                    dict(listen_prob_scale=-1.0), dict(text_repetition_penalty=0.0),
                                    dict(text_repetition_window_size=0)])
def test_decoding_settings_out_of_range_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SessionParams(**kwargs)
