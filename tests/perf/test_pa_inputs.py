"""perf/pa_inputs.py: perf_analyzer data decodes back into the stage contracts (the same
decoder the stage models run), and the scripted sessions follow each stage's ordering rules."""
from __future__ import annotations

import numpy as np
import pytest

from backends.contracts.messages import ACTION_STOP, Code2WavRequest, TalkerRequest, ThinkerRequest
from backends.contracts.tensor_codec import from_arrays, tensor_specs
from perf.pa_inputs import StageDims, duplex_data, is_stop, stage_data

DIMS = StageDims(llm_hidden=8, text_ids=(11, 12, 13, 14, 15, 16), turn_eos=99)
CONTRACTS = {"thinker": ThinkerRequest, "talker": TalkerRequest, "code2wav": Code2WavRequest}


def decode(cls, request):
    """A perf_analyzer JSON request -> the contract, as a stage model would decode it."""
    dtypes = {spec.name: spec.dtype for spec in tensor_specs(cls)}

    def get(name):
        if name not in request:
            return None
        tensor = request[name]
        content = [v.encode() if isinstance(v, str) else v for v in tensor["content"]]
        return np.asarray(content, dtype=dtypes[name]).reshape(tensor["shape"])

    return from_arrays(cls, get)


@pytest.mark.parametrize("model", sorted(CONTRACTS))
def test_every_request_decodes_and_the_session_is_framed_by_stops(model):
    """A stop first (clears a session a cut-short run left started), one last (frees it)."""
    data = stage_data(model, session=3, units=4, dims=DIMS)["data"]
    requests = [decode(CONTRACTS[model], r) for r in data]
    assert all(r.request_id == requests[0].request_id for r in requests)
    assert f"-{3}" in requests[0].request_id
    assert requests[0].action == requests[-1].action == ACTION_STOP and is_stop(data[0]) and is_stop(data[-1])
    assert not any(is_stop(r) for r in data[1:-1])


def test_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="model must be one of"):
        stage_data("duplex", 0, 1, None)


def test_thinker_session_opens_with_text_and_counts_seq():
    requests = [decode(ThinkerRequest, r) for r in stage_data("thinker", 0, 5, None, reply_units=3)["data"][1:-1]]
    assert [r.seq for r in requests] == [0, 1, 2, 3, 4]
    assert requests[0].initial_user_text and requests[0].reply_units == 3 and requests[0].reply_tokens_per_unit == 4
    assert all(r.audio.shape == (16000,) for r in requests)


def test_talker_conditions_carry_hidden_rows_and_end_the_turn():
    requests = [decode(TalkerRequest, r) for r in stage_data("talker", 0, 3, DIMS)["data"][1:-1]]
    assert [r.condition_seq for r in requests] == [0, 1, 2]
    assert [r.turn_start for r in requests] == [True, False, False]
    assert [r.turn_end for r in requests] == [False, False, True]
    assert requests[-1].token_ids[-1] == DIMS.turn_eos
    assert all(r.hidden.shape == (r.token_ids.size, DIMS.llm_hidden) for r in requests)


def test_code2wav_windows_are_consecutive_and_close_the_epoch():
    requests = [decode(Code2WavRequest, r) for r in stage_data("code2wav", 0, 3, None)["data"][1:-1]]
    assert [r.chunk_seq for r in requests] == list(range(len(requests)))
    assert requests[-1].last_chunk and not any(r.last_chunk for r in requests[:-1])
    assert all(0 <= int(c) < 6561 for r in requests for c in r.codes)


def test_duplex_stream_is_speech_then_silence_in_200ms_steps():
    speech = np.full(4000, 1000, dtype=np.int16)
    data = duplex_data(speech, seconds=2.0, num_sequences=2)["data"]
    assert len(data) == 2 and len(data[0]) == 10
    steps = [np.asarray(step["AUDIO"]["content"], dtype=np.int16) for step in data[0]]
    assert all(step.size == 3200 for step in steps)
    assert np.concatenate(steps)[:4000].tolist() == speech.tolist()
    assert not np.concatenate(steps)[4000:].any()
