"""parse_uplink: every bad input of docs/duplex_contract.md (#uplink-every-request, #errors) is
refused with a clear `invalid_argument` message, and good input is passed through unchanged."""
import json

import numpy as np
import pytest

from backends.duplex.errors import DuplexError
from backends.duplex.uplink import RawUplink, parse_uplink

MAX = 16000 * 10


def _raw(start=False, audio=None, ref=None, **params):
    return RawUplink("s1", start, False, audio, ref, json.dumps(params))


def test_start_with_options_and_ref_audio():
    up = parse_uplink(_raw(True, np.zeros(3200, np.int16), np.full(1600, 16384, np.int16),
                           initial_user_text="hi", temperature=0.7, seed=3, reply_units=4), MAX)
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
    (_raw(True, temperature=9.0), r"\(0, 2\]"),
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
