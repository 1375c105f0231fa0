"""Token2Wav streaming contract (facts 1.4, token2wav_facts 1.9) on the tiny random model.

Strategy: cut random code streams into windows with the real `CodecWindowBridge` and decode
them. Sample counts are exact (first 20160, steady 24000, final = the rest, 960 per decoded
code over a stream). Batching is checked by decoding 8 streams at different stages in one call
against 8 single-stream runs. Joins are checked against a stated click bound.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from backends.audio.codec_windows import CodecWindow, CodecWindowBridge
from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavStream

SAMPLES_PER_CODE = 960  # 2 mel frames x 480 samples at 24 kHz
HELD = 3840  # 8 mel frames held back for the cross-fade
# Padded rows take other kernel paths (masked attention, other conv shapes), so float32
# summation order differs: ~1e-6 on the mel, amplified to ~1e-5 by the HiFT's exp magnitudes
# (measured); a leak between rows would show at the signal level (~1e-2).
BATCH_ATOL = 5e-5
# Hamming(7680) starts at 0.08: at a join the new window enters with weight 0.08 on top of the
# held tail, which continues the previous window sample for sample. A join may therefore step
# by at most one ordinary sample step plus 0.08 x the peak amplitude (1.08 allows for the
# not power-complementary halves); a misaligned or missing tail jumps by the full amplitude.
HAMMING_FLOOR = 0.08
MAX_WINDOW_SECONDS = 0.1  # generous CPU bound; measured ~12 ms per steady window on one core


def _windows(codes: list[int], unit_ends: tuple[int, ...] = ()) -> list[CodecWindow]:
    """Bridge windows for `codes`, with non-terminal unit ends after the given frame counts."""
    bridge, windows, start = CodecWindowBridge(), [], 0
    for stop in (*unit_ends, len(codes)):
        windows += bridge.push(codes[start:stop])
        windows += bridge.end_unit() if stop != len(codes) else []
        start = stop
    return windows + bridge.end_turn()


def _stream_window(stream: Token2WavStream, window: CodecWindow) -> StreamWindow:
    return StreamWindow(stream, np.array(window.codes, np.int32), window.last_chunk)


def _decode_stream(model: Token2Wav, windows: list[CodecWindow]) -> list[np.ndarray]:
    stream = model.new_stream()
    return [model.decode([_stream_window(stream, w)])[0] for w in windows]


def _codes(seed: int, count: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 6561, count).tolist()


def test_emitted_sample_counts(token2wav: Token2Wav) -> None:
    chunks = _decode_stream(token2wav, _windows(_codes(0, 103)))
    assert [len(c) for c in chunks] == [20160, 24000, 24000, 24000, HELD + 6 * SAMPLES_PER_CODE]
    assert sum(len(c) for c in chunks) == SAMPLES_PER_CODE * (3 + 103)


@pytest.mark.parametrize("unit_ends", [(7,), (30, 37), (24, 49, 53)])
def test_total_is_960_per_decoded_code(token2wav: Token2Wav, unit_ends: tuple[int, ...]) -> None:
    """Unit-end flushes of odd sizes still emit 960 samples per new code (after the first
    window's held tail), and the final flush drains everything."""
    windows = _windows(_codes(1, 60), unit_ends)
    chunks = _decode_stream(token2wav, windows)
    for window, chunk in zip(windows[1:-1], chunks[1:-1]):
        assert len(chunk) == SAMPLES_PER_CODE * window.num_new_frames
    assert sum(len(c) for c in chunks) == SAMPLES_PER_CODE * (3 + 60)


def test_final_window_may_be_left_context_only(token2wav: Token2Wav) -> None:
    windows = _windows(_codes(2, 50))
    assert windows[-1].num_new_frames == 0
    chunks = _decode_stream(token2wav, windows)
    assert len(chunks[-1]) == HELD + 3 * SAMPLES_PER_CODE


def test_batch_of_8_streams_equals_separate_runs(token2wav: Token2Wav) -> None:
    """Streams at different stages (first, steady, short unit-end, final) share one forward."""
    plans = [_windows(_codes(10 + i, 20 + 13 * i), (5 + 3 * i,)) for i in range(8)]
    expected = [_decode_stream(token2wav, windows) for windows in plans]
    streams = [token2wav.new_stream() for _ in plans]
    got: list[list[np.ndarray]] = [[] for _ in plans]
    for step in range(max(len(p) for p in plans)):
        live = [i for i, p in enumerate(plans) if step < len(p)]
        batch = [
            _stream_window(streams[i], plans[i][step])
            for i in live
        ]
        for i, audio in zip(live, token2wav.decode(batch)):
            got[i].append(audio)
    for mine, theirs in zip(got, expected):
        assert [len(c) for c in mine] == [len(c) for c in theirs]
        mine_audio, their_audio = np.concatenate(mine), np.concatenate(theirs)
        np.testing.assert_allclose(mine_audio, their_audio, atol=BATCH_ATOL, rtol=0)


def test_chunks_join_without_clicks(token2wav: Token2Wav) -> None:
    chunks = _decode_stream(token2wav, _windows(_codes(3, 128)))
    audio = np.concatenate(chunks)
    steps = np.abs(np.diff(audio))
    joins = np.cumsum([len(c) for c in chunks])[:-1]
    inside = np.delete(steps, joins - 1)
    bound = inside.max() + 1.08 * HAMMING_FLOOR * np.abs(audio).max()
    assert steps[joins - 1].max() <= bound, (steps[joins - 1], bound)
    assert np.abs(audio).max() < 0.99  # the random weights do not clip, or joins prove nothing


def test_decoding_is_deterministic(token2wav: Token2Wav) -> None:
    windows = _windows(_codes(4, 40))
    first, second = _decode_stream(token2wav, windows), _decode_stream(token2wav, windows)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_malformed_windows_are_rejected(token2wav: Token2Wav) -> None:
    stream = token2wav.new_stream()
    with pytest.raises(ValueError, match="chunk_below_lookahead_window"):
        token2wav.decode([StreamWindow(stream, np.array([1, 2, 3], np.int32), False)])
    with pytest.raises(ValueError, match="codes must lie"):
        token2wav.decode([StreamWindow(stream, np.array([1, 2, 3, 6561], np.int32), False)])
    window = StreamWindow(stream, np.arange(10, dtype=np.int32), False)
    with pytest.raises(ValueError, match="once per decode"):
        token2wav.decode([window, window])
    token2wav.decode([StreamWindow(stream, np.arange(10, dtype=np.int32), True)])
    with pytest.raises(ValueError, match="already finished"):
        token2wav.decode([window])


def test_empty_final_window_flushes_the_held_tail(token2wav: Token2Wav) -> None:
    stream = token2wav.new_stream()
    token2wav.decode([StreamWindow(stream, np.arange(28, dtype=np.int32), False)])
    (tail,) = token2wav.decode([StreamWindow(stream, np.zeros(0, np.int32), True)])
    assert len(tail) == HELD


def test_speaker_changes_the_audio(token2wav: Token2Wav) -> None:
    codes = np.arange(28, dtype=np.int32)
    default = token2wav.decode([StreamWindow(token2wav.new_stream(), codes, False)])[0]
    other_voice = token2wav.new_stream(torch.arange(192, dtype=torch.float32))
    other = token2wav.decode([StreamWindow(other_voice, codes, False)])[0]
    assert not np.allclose(default, other)
    with pytest.raises(ValueError, match="speaker"):
        token2wav.new_stream(torch.zeros(5))


def test_one_window_is_fast(token2wav: Token2Wav) -> None:
    stream = token2wav.new_stream()
    token2wav.decode([StreamWindow(stream, np.arange(28, dtype=np.int32), False)])  # warm-up
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        token2wav.decode([StreamWindow(stream, np.arange(28, dtype=np.int32), False)])
        timings.append(time.perf_counter() - start)
    assert min(timings) < MAX_WINDOW_SECONDS, timings
