"""The ensemble's codec bridge (`backends.stages.codec_bridge`): Talker groups -> Code2Wav
windows, one utterance per condition.

Strategy: feed the groups a Talker sends (25-frame groups, then a finished remainder) and check
the exact windows (3 silence codes of left context first, 28-code steady windows, a final
flush); then reuse the request id and require the next cache_epoch from chunk_seq 0, which is
what the Code2Wav engine's validation accepts for a returning id.
"""

from __future__ import annotations

import numpy as np

from backends.contracts.messages import TalkerCodes
from backends.models.speech_codes import SILENCE_CODE
from backends.stages.codec_bridge import CodecBridge


def _group(codes: list[int], finished: bool, request_id: str = "u0") -> TalkerCodes:
    return TalkerCodes(request_id, 0, np.array(codes, np.int32), finished)


def test_groups_become_windows_and_the_finish_flushes() -> None:
    bridge = CodecBridge()
    first = bridge.on_codes(_group(list(range(100, 125)), False))
    assert not first.utterance_ended
    (window,) = first.windows
    assert window.codes.tolist() == [SILENCE_CODE] * 3 + list(range(100, 125))
    assert (window.chunk_seq, window.cache_epoch, window.last_chunk) == (0, 0, False)
    last = bridge.on_codes(_group(list(range(125, 133)), True))
    assert last.utterance_ended
    (flush,) = last.windows
    assert flush.codes.tolist() == list(range(122, 133)) and flush.last_chunk
    assert flush.chunk_seq == 1


def test_a_returning_id_starts_the_next_epoch() -> None:
    bridge = CodecBridge()
    bridge.on_codes(_group(list(range(30)), True))
    again = bridge.on_codes(_group(list(range(25)), False))
    assert [(w.cache_epoch, w.chunk_seq) for w in again.windows] == [(1, 0)]
    other = bridge.on_codes(_group(list(range(25)), False, request_id="u1"))
    assert [(w.cache_epoch, w.chunk_seq) for w in other.windows] == [(0, 0)]
    assert bridge.num_requests() == 2


def test_an_empty_utterance_sends_no_window() -> None:
    """A condition that ends at once (empty handoff, early EOS) has nothing to flush."""
    output = CodecBridge().on_codes(_group([], True))
    assert output.windows == [] and output.utterance_ended
