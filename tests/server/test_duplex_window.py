"""The `sliding_window_mode` session parameter on a real server
(docs/model_facts.md#context-window): accepted on START and carried to the Thinker (its
SLIDING_WINDOW_MODE input) without disturbing the session, or refused with a clear error. The
window's behaviour itself is tested at engine level (tests/stages/test_thinker_window.py):
reaching it here would take minutes of audio."""
from __future__ import annotations

import queue

import numpy as np
import pytest

ONE_UNIT = np.zeros(16000, np.int16)
UNITS = 3


def _downlink_events(stream, count: int) -> list[dict]:
    """The next `count` model events on the START request's downlink (errors included)."""
    events: list[dict] = []
    while len(events) < count:
        try:
            item = stream.received.get(timeout=30)
        except queue.Empty:
            break
        if item.request_id == stream.start_request_id and item.event is not None:
            if item.event["type"] in ("response.listen", "response.speak", "error"):
                events.append(item.event)
    return events


@pytest.mark.parametrize("mode", ["basic", "context"])
def test_window_mode_reaches_the_thinker(stream, mode):
    s = stream()
    s.send(ONE_UNIT[:1600], start=True, sliding_window_mode=mode)
    for _ in range(UNITS):
        rid = s.send(ONE_UNIT)
        assert s.collect_until_final(rid)[-1].error is None
    events = _downlink_events(s, UNITS)
    assert [e["type"] for e in events] == ["response.listen"] * UNITS, events


def test_unknown_window_mode_is_refused(stream):
    s = stream()
    rid = s.send(ONE_UNIT[:1600], start=True, sliding_window_mode="rolling")
    events = [r.event for r in s.collect_until_final(rid) if r.event]
    assert events[0]["type"] == "error" and events[0]["code"] == "invalid_argument"
    assert "sliding_window_mode" in events[0]["message"]
