"""Bad input to `duplex` on a real server: each gets a clear error naming the problem, the
session (when there is one) keeps working, and a valid session afterwards still works."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import RawStream

ONE_UNIT = np.zeros(16000, np.int16)


def _start(stream: RawStream) -> str:
    rid = stream.send(ONE_UNIT[:3200], start=True)
    return rid


def _first_event(stream: RawStream, start_rid: str) -> dict:
    item = stream.received.get(timeout=30)
    assert item.request_id == start_rid and item.event is not None, item
    return item.event


def _input(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


@pytest.mark.parametrize("kwargs,needle", [
    ({"inputs": [_input("AUDIO", np.zeros(160, np.float32), "FP32")]}, "data-type"),
    ({"inputs": [_input("AUDIO", np.zeros((2, 80), np.int16), "INT16")]}, "shape"),
    ({"audio": ONE_UNIT[:160], "sample_rate": 8000}, "sample_rate must be 16000"),
    ({"audio": ONE_UNIT[:160], "action": "dance"}, "unknown action"),
    ({"audio": np.zeros(16000 * 11, np.int16)}, "over the limit"),
    ({"audio": ONE_UNIT[:160], "temperature": 0.5}, "START only"),
])
def test_bad_append_fails_that_request_only(stream, kwargs, needle):
    s = stream()
    start_rid = _start(s)
    assert _first_event(s, start_rid)["type"] == "session.created"
    rid = s.send(**kwargs)
    answer = s.collect_until_final(rid)
    errors = [r.error or (r.event or {}).get("message", "") for r in answer if r.error]
    assert errors and needle.lower() in errors[0].lower(), answer
    ok = s.send(ONE_UNIT)  # the session is still open
    assert s.collect_until_final(ok)[-1].error is None


def test_non_start_request_of_unknown_session_is_refused(stream):
    s = stream()
    rid = s.send(ONE_UNIT[:1600])
    answer = s.collect_until_final(rid)
    assert "must specify the START flag" in answer[0].error  # Triton's sequence batcher


def test_a_refused_start_frees_its_sequence_and_a_retry_with_the_same_id_works(stream):
    s = stream()
    start = s.send(ONE_UNIT[:1600], start=True, reply_units=-1)
    assert s.collect_until_final(start)[0].event["type"] == "error"
    rid = s.send(ONE_UNIT[:1600])  # the refusal ended the sequence before it was sent
    assert "must specify the START flag" in s.collect_until_final(rid)[0].error
    retry = s.send(ONE_UNIT[:1600], start=True)
    first = s.received.get(timeout=10)
    assert first.request_id == retry and first.event["type"] == "session.created", first


@pytest.mark.parametrize("params,needle", [
    ({"temperature": "hot"}, "wrong type"),
    ({"reply_units": 999}, "reply_units"),
    ({"initial_user_text": "é" * 5000}, "longer than"),
    ({"no_such_knob": 1}, "unknown request parameter"),
])
def test_bad_start_is_refused_on_its_downlink(stream, params, needle):
    s = stream()
    rid = s.send(ONE_UNIT[:1600], start=True, **params)
    answer = s.collect_until_final(rid)
    events = [r.event for r in answer if r.event]
    assert events and events[0]["type"] == "error" and events[0]["code"] == "invalid_argument"
    assert needle in events[0]["message"]
    assert answer[-1].final


def test_valid_session_after_bad_input(stream, server):
    from test_duplex_server import _session

    report, _ = _session(server.grpc_url, "srv-after-bad", reply_units=2)
    assert report.ok, report.errors
