"""The named edge cases of docs/architecture.md#edge-cases-the-tests-hold, on a real server.

Edge cases 1-7 and 10 are here; 8 (no leaks after many sessions of every fate) is
test_reliability_leaks.py::test_edge_case_8_*, 9 (context overflow) is
test_reliability_faults.py::test_edge_case_9_*. Engine-level versions of several live next to
the engines (tests/stages, tests/thinker, tests/audio); these check the same contracts through
Triton, where the requests really race.

Strategy: whole sessions through `duplex` (tests/server/session_probe.py) where the client can
observe the case, and direct requests to a stage model (tests/server/stage_calls.py) where
only the stage can; what the stages hold is read from the resource gauges. Direct stage
requests use ids starting with "ec" and are stopped at the end of each test.
"""
from __future__ import annotations

import threading
import time

import numpy as np
from server_resources import settled, wait_for_gauges
from session_probe import silence_units, speech_units
from stage_calls import StageCall, StageEndpoint, call, stop

from backends.audio.codec_windows import CodecWindowBridge
from backends.checkpoint.tiny_config import TINY_HIDDEN
from backends.contracts.messages import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult,
)
from backends.stages.code2wav_engine import request_from_window

REPLY = {"initial_user_text": "Tell me a story.", "reply_units": 3, "reply_tokens_per_unit": 2, "seed": 4}
FRAMES = 25  # codec frames of a full Talker chunk (docs/model_facts.md#talker-chunks)
TURN_END_MAX_FRAMES = 103
FIRST_WINDOW_SAMPLES = 20160  # 25 x 960 - 3840 held back (docs/model_facts.md#code2wav-windows)
STEADY_WINDOW_SAMPLES = 24000
STAGE_CAPACITY = 6  # requests whose whole context fits a stage's KV pool (reliability profile)


def _epoch_of(response_id: str, session_id: str) -> int:
    return int(response_id[len(f"resp-{session_id}-"):].split("-")[0])


def _condition(request_id: str, seq: int, turn_start: bool = False, turn_end: bool = False,
               seed: int = 42) -> TalkerRequest:
    tokens = np.arange(5 + seq, 9 + seq, dtype=np.int32)  # [4] ordinary text ids
    hidden = np.random.default_rng(seq).standard_normal((tokens.size, TINY_HIDDEN)).astype(np.float32)
    return TalkerRequest(request_id=request_id, condition_seq=seq, token_ids=tokens, hidden=hidden,
                         turn_start=turn_start, turn_end=turn_end, seed=seed)


def _frames(groups: list[TalkerCodes]) -> list[int]:
    return [int(c) for group in groups for c in group.codes]


def _windows(codes: list[int]) -> list:
    bridge = CodecWindowBridge()
    return bridge.push(codes) + bridge.end_turn()


def _codes(count: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 6561, count).tolist()


def _thinker_unit(request_id: str, seq: int, **setup) -> ThinkerRequest:
    return ThinkerRequest(request_id=request_id, audio=np.zeros(16000, np.float32), seq=seq, **setup)


# ---- 1: request ownership on a cancel before the first prefill ----------------------------------


def test_edge_case_1_cancel_before_the_first_prefill(reliability_server, baseline, probes):
    """START, the first unit and a cancel leave back to back, so the stop races the epoch's
    first (still planned or queued) Thinker append. Whatever wins: an epoch-0 response that
    appeared is cancelled and nothing of it follows, the new epoch answers, and the superseded
    request is gone from the Thinker (a stop overtaken by its append would leave it open)."""
    for delay_s in (0.0, 0.01, 0.05):
        probe = probes()
        probe.start(**REPLY)
        probe.append(silence_units(1))
        time.sleep(delay_s)
        probe.cancel()
        probe.append(speech_units(2, seed=2))
        probe.append(silence_units(3))
        fresh = probe.wait_for(lambda e: e["type"] == "response.done" and e["response_id"].startswith(
            f"resp-{probe.session_id}-1-"), "the new epoch's reply")
        assert fresh["status"] == "completed"
        probe.end()
        events = probe.wait_closed()
        old = [i for i, e in enumerate(events) if e.get("response_id") and
               _epoch_of(e["response_id"], probe.session_id) == 0]
        if old:  # the Thinker answered before the stop: cancelled, and the last word of epoch 0
            assert events[old[-1]]["type"] == "response.done" and events[old[-1]]["status"] == "cancelled"
            assert not any(events[i]["type"] == "response.audio.delta" for i in old)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 2: a mixed prefill/decode step -------------------------------------------------------------


def _reply_unit(stages: StageEndpoint, request_id: str) -> ThinkerUnitResult:
    answer = call(stages, "thinker", _thinker_unit(request_id, 0, initial_user_text="Hello there.", reply_units=2,
                                                reply_tokens_per_unit=8, seed=9), ThinkerUnitResult)
    assert answer.error is None and len(answer.results) == 1, answer
    return answer.results[0]


def test_edge_case_2_a_decoding_row_beside_a_prefilling_one_keeps_its_handoff(reliability_server, baseline):
    """One session decodes its reply (8 tokens) while others prefill appends in the same
    runner steps. The decoding row has no prompt snapshot in those steps; its handoff (tokens,
    text, hidden rows) must equal the one it produces alone."""
    stages = StageEndpoint.of(reliability_server)
    try:
        alone = _reply_unit(stages, "ec2-alone.e0")
        mixed: list[ThinkerUnitResult] = []
        decoder = threading.Thread(target=lambda: mixed.append(_reply_unit(stages, "ec2-mixed.e0")))
        decoder.start()
        for i in range(4):  # prefills that land in the decoder's steps
            assert call(stages, "thinker", _thinker_unit(f"ec2-prefill-{i}.e0", 0), ThinkerUnitResult).error is None
        decoder.join(60)
        (together,) = mixed
        assert together.decision == alone.decision == "speak"
        assert together.text == alone.text and together.text
        np.testing.assert_array_equal(together.token_ids, alone.token_ids)
        np.testing.assert_array_equal(together.tts_token_ids, alone.tts_token_ids)
        np.testing.assert_allclose(together.tts_hidden, alone.tts_hidden, atol=1e-4)
    finally:
        for rid in ("ec2-alone.e0", "ec2-mixed.e0", *(f"ec2-prefill-{i}.e0" for i in range(4))):
            stop(stages, "thinker", rid)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 3 and 5: EOS of the current step only; chunk boundaries 24/25/26 -----------------------------


def test_edge_case_3_an_eos_in_history_never_ends_a_later_segment(reliability_server, baseline):
    """Each mid-turn chunk after a chunk that ended on EOS still forwards its full 25 frames:
    only an EOS sampled in the chunk's own steps may end it, and every chunk ends exactly
    once (one `finished` group, the last)."""
    stages = StageEndpoint.of(reliability_server)
    rid = "ec3.e0"
    try:
        chunks = []
        for seq in range(4):
            answer = call(stages, "talker", _condition(rid, seq, turn_start=seq == 0), TalkerCodes)
            assert answer.error is None, answer.error
            assert [g.finished for g in answer.results] == [False] * (len(answer.results) - 1) + [True]
            chunks.append(_frames(answer.results))
        assert 1 <= len(chunks[0]) <= FRAMES
        assert [len(c) for c in chunks[1:]] == [FRAMES] * 3
    finally:
        stop(stages, "talker", rid)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


def test_edge_case_5_chunk_and_window_boundaries(reliability_server, baseline):
    """Talker: a turn-start chunk ends by frame 25 (its 26th sample is a forced EOS), a
    turn-end chunk runs to at most 103 frames. Code2Wav: windows are 3 context + new frames,
    the first yields 20160 samples and a steady one 24000, and a non-final window with no more
    codes than the look-ahead is refused."""
    stages = StageEndpoint.of(reliability_server)
    try:
        start = call(stages, "talker", _condition("ec5.e0", 0, turn_start=True), TalkerCodes)
        end = call(stages, "talker", _condition("ec5.e0", 1, turn_end=True), TalkerCodes)
        assert start.error is None and end.error is None
        assert 1 <= len(_frames(start.results)) <= FRAMES
        assert 1 <= len(_frames(end.results)) <= TURN_END_MAX_FRAMES
        windows = _windows(_codes(2 * FRAMES, seed=5))
        assert [len(w.codes) for w in windows[:2]] == [3 + FRAMES, 3 + FRAMES] and windows[0].codes[:3] == (4218,) * 3
        sizes = []
        for window in windows[:2]:
            answer = call(stages, "code2wav", request_from_window("ec5-c.e0", window), Code2WavAudio)
            assert answer.error is None, answer.error
            sizes.append(sum(chunk.audio.size for chunk in answer.results))
        assert sizes == [FIRST_WINDOW_SAMPLES, STEADY_WINDOW_SAMPLES]
        short = Code2WavRequest("ec5-c.e0", 0, 2, np.asarray(windows[1].codes[-3:], np.int32), 3, False)
        refused = call(stages, "code2wav", short, Code2WavAudio)
        assert refused.results == [] and "chunk_below_lookahead_window" in refused.error
    finally:
        stop(stages, "talker", "ec5.e0")
        stop(stages, "code2wav", "ec5-c.e0")
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 4: a duplicate terminal flush ------------------------------------------------------------


def test_edge_case_4_a_second_turn_end_replays_nothing(reliability_server, baseline, probes):
    """Code2Wav refuses a second terminal window of a turn without audio; a whole reply reaches
    the client with exactly one response.done, after its last audio."""
    stages = StageEndpoint.of(reliability_server)
    windows = _windows(_codes(FRAMES + 5, seed=4))
    assert windows[-1].last_chunk
    try:
        for window in windows:
            assert call(stages, "code2wav", request_from_window("ec4.e0", window), Code2WavAudio).error is None
        again = Code2WavRequest("ec4.e0", windows[-1].cache_epoch, windows[-1].chunk_seq + 1,
                                np.asarray(windows[-1].codes[-3:], np.int32), 3, True)
        replay = call(stages, "code2wav", again, Code2WavAudio)
        assert replay.results == [] and "chunk_after_last_chunk" in replay.error
    finally:
        stop(stages, "code2wav", "ec4.e0")
    probe = probes()
    probe.start(**REPLY)
    probe.append(silence_units(4))
    done = probe.wait_type("response.done")
    probe.end()
    events = probe.wait_closed()
    mine = [e["type"] for e in events if e.get("response_id") == done["response_id"]]
    assert mine.count("response.done") == 1 and mine[-1] == "response.done"
    assert "response.audio.delta" in mine
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 6: overlapping requests keyed by request id ----------------------------------------------


def test_edge_case_6_old_and_new_epoch_never_share_codec_state(reliability_server, baseline):
    """The old and the new request of one session (epochs 0 and 1) interleave their windows;
    stopping the old one must leave the new one's state alone, whose audio equals a solo
    decode of the same codes; a window sent twice is refused, not decoded twice."""
    stages = StageEndpoint.of(reliability_server)
    old_windows, new_windows = _windows(_codes(3 * FRAMES, seed=60)), _windows(_codes(3 * FRAMES, seed=61))
    try:
        solo = [call(stages, "code2wav", request_from_window("ec6-solo.e1", w), Code2WavAudio) for w in new_windows]
        interleaved = []
        for i, window in enumerate(new_windows):
            if i < len(old_windows) - 1:
                old = request_from_window("ec6.e0", old_windows[i])
                assert call(stages, "code2wav", old, Code2WavAudio).error is None
            if i == 2:
                stop(stages, "code2wav", "ec6.e0")
            interleaved.append(call(stages, "code2wav", request_from_window("ec6.e1", window), Code2WavAudio))
        for together, alone in zip(interleaved, solo):
            assert together.error is None and alone.error is None
            np.testing.assert_allclose(together.results[0].audio, alone.results[0].audio, atol=1e-5)
        twice = call(stages, "code2wav", request_from_window("ec6.e1", new_windows[-1]), Code2WavAudio)
        assert twice.results == [] and twice.error
    finally:
        for rid in ("ec6.e0", "ec6.e1", "ec6-solo.e1"):
            stop(stages, "code2wav", rid)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 7: abort marking ---------------------------------------------------------------------------


# The stop races the chunk's remaining groups (it won after the second of a turn-end chunk's
# groups on a loaded 2-core box); each lost race costs one more chunk.
STOP_ATTEMPTS = 5


def _stopped_mid_chunk(stages: StageEndpoint, rid: str) -> list[TalkerCodes] | None:
    """A turn-end chunk (up to 103 frames) stopped after its first group: the groups it sent,
    or None when it completed before the stop arrived (a race the stop can lose)."""
    assert call(stages, "talker", _condition(rid, 0, turn_start=True), TalkerCodes).error is None
    chunk = StageCall(stages, "talker", _condition(rid, 1, turn_end=True), TalkerCodes)
    first = chunk.next_result()
    assert first is not None
    stop(stages, "talker", rid)
    answer = chunk.wait()
    return None if any(group.finished for group in answer.results) else answer.results


def test_edge_case_7_a_stopped_request_produces_nothing_more(reliability_server, baseline):
    """A Talker chunk stopped after its first frames ends at once, without its `finished`
    group; a later condition of the stopped request is refused without frames; Code2Wav drops
    a stopped request's codec state, so its next window is refused instead of decoded."""
    stages = StageEndpoint.of(reliability_server)
    rids = [f"ec7-{attempt}.e0" for attempt in range(STOP_ATTEMPTS)]
    try:
        stopped = next(groups for rid in rids if (groups := _stopped_mid_chunk(stages, rid)) is not None)
        assert len(_frames(stopped)) < TURN_END_MAX_FRAMES
        late = call(stages, "talker", _condition(rids[0], 2), TalkerCodes)
        assert late.results == [] and "cancelled" in late.error
        windows = _windows(_codes(2 * FRAMES, seed=7))
        assert call(stages, "code2wav", request_from_window("ec7-c.e0", windows[0]), Code2WavAudio).error is None
        held = {("codec_states", "code2wav"): 1.0}
        assert wait_for_gauges(reliability_server, held) == held
        stop(stages, "code2wav", "ec7-c.e0")
        after = call(stages, "code2wav", request_from_window("ec7-c.e0", windows[1]), Code2WavAudio)
        assert after.results == [] and "out_of_order_chunk_seq" in after.error
    finally:
        for rid in rids:
            stop(stages, "talker", rid)
        stop(stages, "code2wav", "ec7-c.e0")
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()


# ---- 10: no preemption ----------------------------------------------------------------------------


def test_edge_case_10_a_full_stage_refuses_instead_of_preempting(reliability_server, baseline):
    """Each Thinker and Talker request reserves its whole context, so a full KV pool refuses
    the next request with resource_exhausted; the admitted ones are never preempted and their
    output is what it would be alone."""
    stages = StageEndpoint.of(reliability_server)
    # Capacity counts from an idle server: earlier tests' stage requests must have drained.
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()
    thinkers = [f"ec10-{i}.e0" for i in range(STAGE_CAPACITY + 1)]
    talkers = [f"ec10-t{i}.e0" for i in range(STAGE_CAPACITY + 1)]
    try:
        alone = call(stages, "talker", _condition("ec10-alone.e0", 0, turn_start=True), TalkerCodes)
        stop(stages, "talker", "ec10-alone.e0")
        answers = [call(stages, "thinker", _thinker_unit(rid, 0), ThinkerUnitResult) for rid in thinkers]
        assert [a.error for a in answers[:-1]] == [None] * STAGE_CAPACITY
        assert "resource_exhausted" in answers[-1].error
        calls = [StageCall(stages, "talker", _condition(rid, 0, turn_start=True), TalkerCodes) for rid in talkers]
        chunks = [c.wait() for c in calls]  # sent together: the admitted ones share runner steps
        # Each rides its own stream, so they reach the Talker in any order: one is refused.
        refused = [c for c in chunks if c.error is not None]
        assert len(refused) == 1 and "resource_exhausted" in refused[0].error, [c.error for c in chunks]
        admitted = [c for c in chunks if c.error is None]
        assert all(_frames(c.results) == _frames(alone.results) for c in admitted)
    finally:
        for rid in thinkers:
            stop(stages, "thinker", rid)
        for rid in talkers:
            stop(stages, "talker", rid)
    assert settled(reliability_server, baseline).tracked() == baseline.tracked()
