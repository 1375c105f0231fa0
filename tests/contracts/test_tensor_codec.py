"""tensor_codec: every contract round-trips through named arrays, and bad input is refused
with a ContractError naming the tensor (it becomes INVALID_ARG at the server)."""
import numpy as np
import pytest

from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, stop_request,
)
from backends.contracts.tensor_codec import ContractError, encode_text, from_arrays, tensor_specs, to_arrays


def _roundtrip(obj):
    return from_arrays(type(obj), to_arrays(obj).get)


def test_thinker_request_roundtrip_keeps_values_and_defaults():
    req = ThinkerRequest(request_id="s1.e0", audio=np.arange(16000, dtype=np.float32), seq=3,
                         initial_user_text="héllo", temperature=0.5, reply_units=4)
    back = _roundtrip(req)
    assert back.request_id == "s1.e0" and back.seq == 3 and back.initial_user_text == "héllo"
    assert back.temperature == 0.5 and back.reply_units == 4 and back.force_listen is False
    np.testing.assert_array_equal(back.audio, req.audio)
    assert back.ref_audio.shape == (0,)


def test_result_with_2d_hidden_roundtrips():
    res = ThinkerUnitResult(request_id="r", seq=0, unit_index=2, decision="speak",
                            token_ids=np.array([1, 2, 3], np.int32), text="hi",
                            tts_token_ids=np.array([2], np.int32), tts_hidden=np.ones((1, 8), np.float32),
                            turn_start=True, turn_end=False, segment_end=True)
    back = _roundtrip(res)
    assert back.tts_hidden.shape == (1, 8) and back.turn_start and back.segment_end and back.text == "hi"


def test_optional_inputs_may_be_absent_and_required_ones_may_not():
    arrays = to_arrays(TalkerCodes(request_id="r", condition_seq=1, codes=np.zeros(3, np.int32), finished=True))
    del arrays["FINISHED"]
    with pytest.raises(ContractError, match="FINISHED"):
        from_arrays(TalkerCodes, arrays.get)
    minimal = {"REQUEST_ID": encode_text("r"), "AUDIO": np.zeros(4, np.float32)}
    assert from_arrays(ThinkerRequest, minimal.get).seq == 0


@pytest.mark.parametrize("name,value,match", [
    ("AUDIO", np.zeros(4, np.float64), "float32"),
    ("AUDIO", np.zeros((2, 2), np.float32), "rank"),
    ("SEQ", np.array([1, 2], np.int64), "one element"),
    ("SEQ", np.array([1.0], np.float32), "int64"),
    ("REQUEST_ID", np.array([b"r"], object), "UTF-8 text as uint8"),
    ("REQUEST_ID", np.array([[114]], np.uint8), "UTF-8 text as uint8"),
    ("REQUEST_ID", np.array([0xff, 0xfe], np.uint8), "not valid UTF-8"),
])
def test_bad_tensors_are_refused_with_their_name(name, value, match):
    arrays = to_arrays(ThinkerRequest(request_id="r", audio=np.zeros(4, np.float32)))
    arrays[name] = value
    with pytest.raises(ContractError, match=match):
        from_arrays(ThinkerRequest, arrays.get)


def test_specs_follow_field_order_and_types():
    specs = {s.name: s for s in tensor_specs(Code2WavRequest)}
    assert specs["CODES"].triton_dtype == "TYPE_INT32" and specs["CODES"].dims == (-1,)
    assert specs["LAST_CHUNK"].triton_dtype == "TYPE_BOOL" and specs["LAST_CHUNK"].optional
    assert specs["REQUEST_ID"].triton_dtype == "TYPE_UINT8" and specs["REQUEST_ID"].dims == (-1,)
    assert specs["REQUEST_ID"].is_text and not specs["REQUEST_ID"].optional
    assert [s.name for s in tensor_specs(Code2WavAudio)] == ["REQUEST_ID", "CHUNK_SEQ", "AUDIO"]


@pytest.mark.parametrize("stage,cls", [("thinker", ThinkerRequest), ("talker", TalkerRequest),
                                       ("code2wav", Code2WavRequest)])
def test_stop_requests_encode(stage, cls):
    msg = stop_request(stage, "s.e1")
    back = _roundtrip(msg)
    assert isinstance(back, cls) and back.action == "stop" and back.request_id == "s.e1"


@pytest.mark.parametrize("text", ["", "s1.e0", "héllo 🎙", "\x00"])
def test_text_fields_travel_as_utf8_bytes(text):
    """No TYPE_STRING between our models: a stub under numpy 2 cannot read or build one."""
    arrays = to_arrays(ThinkerRequest(request_id="r", audio=np.zeros(4, np.float32), instructions=text))
    assert arrays["INSTRUCTIONS"].dtype == np.uint8 and arrays["INSTRUCTIONS"].shape == (len(text.encode()),)
    assert all(array.dtype != np.object_ for array in arrays.values())
    assert from_arrays(ThinkerRequest, arrays.get).instructions == text
