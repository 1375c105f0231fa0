"""parse_uplink and the session's `sliding_window_mode` START parameter
(docs/model_facts.md#context-window).

Strategy: the mode is accepted on START only, as one of the Thinker's modes, and reaches
SessionOptions unchanged; anything else is `invalid_argument`.
"""
import json

import numpy as np
import pytest

from backends.duplex.errors import DuplexError
from backends.duplex.uplink import RawUplink, parse_uplink

MAX = 16000 * 10


def _raw(start: bool, **params: object) -> RawUplink:
    return RawUplink("s1", start, False, np.zeros(1600, np.int16), None, json.dumps(params))


@pytest.mark.parametrize("mode", ["off", "basic", "context"])
def test_modes_are_accepted_on_start(mode: str) -> None:
    options = parse_uplink(_raw(True, sliding_window_mode=mode), MAX).options
    assert options.sliding_window_mode == mode


def test_default_is_the_thinker_default() -> None:
    assert parse_uplink(_raw(True), MAX).options.sliding_window_mode == ""


@pytest.mark.parametrize(("raw", "match"), [
    (_raw(True, sliding_window_mode="sliding"), "must be one of"),
    (_raw(True, sliding_window_mode=1), "wrong type"),
    (_raw(False, sliding_window_mode="basic"), "START only"),
])
def test_bad_modes_are_refused(raw: RawUplink, match: str) -> None:
    with pytest.raises(DuplexError, match=match):
        parse_uplink(raw, MAX)
