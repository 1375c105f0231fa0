"""Tests for client/recorder.py.

Strategy: feed hand-built append times and parsed events in a fixed order and compare the
resulting timelines field by field; each case pins one rule of where a turn starts.
"""

import json

import numpy as np

from client.events import parse_event
from client.metrics import ChunkArrival
from client.recorder import TurnRecorder

CHUNK = np.zeros(2400, dtype=np.int16)  # 100 ms at 24 kHz


def event(received_s: float, **fields: object):
    audio = CHUNK if fields["type"] == "response.audio.delta" else None
    text = json.dumps({"session_id": "s", **fields})
    return parse_event(text, received_s=received_s, audio=audio)


def delta(received_s: float, response_id: str, text: str = "", ttfp_ms: float | None = None):
    extra = {} if ttfp_ms is None else {"ttfp_ms": ttfp_ms}
    return event(received_s, type="response.audio.delta", response_id=response_id, turn_id=0,
                 text=text, audio_ms=100, **extra)


def test_turn_starts_at_first_append_and_next_turn_after_done():
    recorder = TurnRecorder(session_start_s=0.0)
    for sent_s in (1.0, 1.2, 1.4):
        recorder.on_append(sent_s)
    recorder.on_event(event(2.0, type="response.created", response_id="a"))
    recorder.on_event(delta(2.1, "a", text="", ttfp_ms=300.0))
    recorder.on_event(delta(2.3, "a", text="hello", ttfp_ms=999.0))
    recorder.on_append(2.4)  # still turn 1: the response is open
    recorder.on_event(event(2.5, type="response.done", response_id="a", status="completed"))
    recorder.on_append(2.6)  # first append after done: turn 2 starts here
    recorder.on_append(2.8)
    recorder.on_event(event(3.0, type="response.created", response_id="b"))
    first, second = recorder.timelines()
    assert (first.response_id, first.turn_start_s, first.status) == ("a", 1.0, "completed")
    assert first.first_text_s == 2.3  # the first chunk had no text
    assert first.server_ttfp_ms == 300.0  # only the first ttfp_ms counts
    assert first.chunks == (ChunkArrival(2.1, 2400), ChunkArrival(2.3, 2400))
    assert (second.turn_start_s, second.status, second.chunks) == (2.6, None, ())
    assert recorder.has_open_response and recorder.num_done == 1


def test_text_delta_sets_first_text_and_server_ttft():
    recorder = TurnRecorder(session_start_s=0.0)
    recorder.on_append(1.0)
    recorder.on_event(event(1.5, type="response.text.delta", response_id="a", text="",
                            ttft_ms=40.0))
    recorder.on_event(event(1.75, type="response.text.delta", response_id="a", text="Once",
                            ttft_ms=99.0))
    recorder.on_event(delta(2.0, "a", text="upon"))
    (only,) = recorder.timelines()
    assert (only.first_text_s, only.server_ttft_ms) == (1.75, 40.0)
    assert len(only.chunks) == 1


def test_response_before_any_append_starts_at_session_start():
    """A text-primed session can answer before the first append."""
    recorder = TurnRecorder(session_start_s=5.0)
    recorder.on_event(delta(5.5, "a"))  # audio without response.created still opens it
    (only,) = recorder.timelines()
    assert only.turn_start_s == 5.0 and len(only.chunks) == 1


def test_back_to_back_response_starts_at_previous_done():
    recorder = TurnRecorder(session_start_s=0.0)
    recorder.on_append(1.0)
    recorder.on_event(event(2.0, type="response.created", response_id="a"))
    recorder.on_event(event(3.0, type="response.done", response_id="a", status="cancelled"))
    recorder.on_event(event(3.1, type="response.created", response_id="b"))
    assert [t.turn_start_s for t in recorder.timelines()] == [1.0, 3.0]


def test_done_without_id_closes_the_latest_open_response():
    recorder = TurnRecorder(session_start_s=0.0)
    recorder.on_event(event(1.0, type="response.created", response_id="a"))
    recorder.on_event(event(1.1, type="response.created", response_id="b"))
    recorder.on_event(event(2.0, type="response.done", status="completed"))
    statuses = {t.response_id: t.status for t in recorder.timelines()}
    assert statuses == {"a": None, "b": "completed"}
    assert recorder.has_open_response and recorder.num_done == 1


def test_done_without_id_and_nothing_open_is_ignored():
    recorder = TurnRecorder(session_start_s=0.0)
    recorder.on_event(event(1.0, type="response.done", status="completed"))
    assert recorder.timelines() == [] and not recorder.has_open_response
