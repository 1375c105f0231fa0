"""Talker -> Code2Wav window cutting (docs/model_facts.md#code2wav-windows;
docs/architecture.md edge cases 4 and 5).

Strategy: exact tables for the boundary cases (24/25/26 frames, 1..4 held frames, a 103-frame
turn end, a left-context-only drain, a duplicate terminal flush), plus a hypothesis property
over random push / unit-end / turn-end sequences: within each epoch the new frames of the
windows concatenate to exactly the frames pushed, every window's left context is the previous
window's last 3 codes (3 silence codes first), chunk_seq counts 0, 1, 2, ... and every
non-final window carries more than 3 codes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.models.speech_codes import SILENCE_CODE

SILENCE = (SILENCE_CODE,) * 3


def _frames(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_24_frames_flush_as_one_window_at_unit_end() -> None:
    bridge = CodecWindowBridge()
    assert bridge.push(_frames(0, 24)) == []
    (window,) = bridge.end_unit()
    assert window.codes == SILENCE + tuple(_frames(0, 24))
    assert (window.num_left_context, window.num_new_frames, window.chunk_seq) == (3, 24, 0)
    assert not window.last_chunk and window.unit_end


def test_25_frames_emit_a_28_code_window_at_once() -> None:
    bridge = CodecWindowBridge()
    (window,) = bridge.push(_frames(0, 25))
    assert window.codes == SILENCE + tuple(_frames(0, 25)) and not window.unit_end
    assert bridge.end_unit() == []


def test_26th_frame_waits_and_is_held_at_unit_end() -> None:
    bridge = CodecWindowBridge()
    assert len(bridge.push(_frames(0, 26))) == 1
    assert bridge.end_unit() == [] and bridge.num_pending == 1


@pytest.mark.parametrize("held", [1, 2, 3, 4])
def test_1_to_4_frames_are_held_and_merged_into_the_next_unit(held: int) -> None:
    bridge = CodecWindowBridge()
    first = bridge.push(_frames(0, 25 + held))
    assert bridge.end_unit() == []
    (window,) = bridge.push(_frames(100, 25 - held))
    assert window.codes[:3] == first[0].codes[-3:]
    assert window.codes[3:] == tuple(_frames(25, held) + _frames(100, 25 - held))
    assert window.chunk_seq == 1


def test_5_frames_are_enough_to_flush_at_unit_end() -> None:
    bridge = CodecWindowBridge()
    bridge.push(_frames(0, 5))
    (window,) = bridge.end_unit()
    assert window.num_new_frames == 5


def test_103_frame_turn_end() -> None:
    bridge = CodecWindowBridge()
    windows = bridge.push(_frames(0, 103)) + bridge.end_turn()
    assert [w.num_new_frames for w in windows] == [25, 25, 25, 25, 3]
    assert [w.chunk_seq for w in windows] == [0, 1, 2, 3, 4]
    assert [w.last_chunk for w in windows] == [False] * 4 + [True]
    assert windows[-1].codes == tuple(_frames(97, 6))
    assert {w.cache_epoch for w in windows} == {0}


def test_turn_end_with_nothing_pending_sends_left_context_only() -> None:
    bridge = CodecWindowBridge()
    bridge.push(_frames(0, 50))
    (drain,) = bridge.end_turn()
    assert drain.codes == (47, 48, 49) and drain.num_new_frames == 0 and drain.last_chunk


def test_next_turn_starts_a_new_epoch_with_silence() -> None:
    bridge = CodecWindowBridge()
    bridge.push(_frames(0, 30))
    bridge.end_turn()
    (window,) = bridge.push(_frames(200, 25))
    assert (window.cache_epoch, window.chunk_seq) == (1, 0)
    assert window.codes[:3] == SILENCE


def test_duplicate_terminal_flush_is_a_no_op() -> None:
    """Edge case 4: a second turn-end boundary must not replay the terminal window."""
    bridge = CodecWindowBridge()
    bridge.push(_frames(0, 10))
    assert len(bridge.end_turn()) == 1
    assert bridge.end_turn() == []
    assert bridge.cache_epoch == 1


def test_turn_without_frames_sends_nothing() -> None:
    assert CodecWindowBridge().end_turn() == []


def test_new_epoch_drops_pending_frames() -> None:
    bridge = CodecWindowBridge()
    bridge.push(_frames(0, 10))
    bridge.start_new_epoch()
    assert bridge.num_pending == 0 and bridge.next_chunk_seq == 0 and bridge.cache_epoch == 1


_ACTIONS = st.lists(
    st.one_of(st.integers(min_value=0, max_value=60), st.sampled_from(["unit", "turn"])),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_ACTIONS)
def test_windows_partition_the_frames(actions: list[int | str]) -> None:
    bridge = CodecWindowBridge()
    pushed: dict[int, list[int]] = {}
    windows: list[CodecWindow] = []
    next_frame = 0
    for action in actions:
        if action == "unit":
            windows += bridge.end_unit()
        elif action == "turn":
            windows += bridge.end_turn()
        else:
            frames = _frames(next_frame, int(action))
            next_frame += int(action)
            pushed.setdefault(bridge.cache_epoch, []).extend(frames)
            windows += bridge.push(frames)
    windows += bridge.end_turn()
    _check_epochs(pushed, windows)


def _check_epochs(pushed: dict[int, list[int]], windows: list[CodecWindow]) -> None:
    for epoch, frames in pushed.items():
        own = [w for w in windows if w.cache_epoch == epoch]
        if not frames:
            assert own == []
            continue
        assert [w.chunk_seq for w in own] == list(range(len(own)))
        assert [c for w in own for c in w.codes[w.num_left_context:]] == frames
        context = SILENCE
        for window in own:
            assert window.codes[:3] == context
            assert window.last_chunk or len(window.codes) > 3 + 4
            context = window.codes[-3:]
        assert own[-1].last_chunk and not any(w.last_chunk for w in own[:-1])
