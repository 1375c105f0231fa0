"""Per-session streaming audio encoder: the 10-embeddings-per-unit contract and its wiring.

Strategy: run the tiny tower (random weights) over 40 units of noise once per module and
check the count invariant on every unit, the KV cache length after every unit (reset at unit
29, i.e. past 30 s), and that the reset unit equals its mel chunk encoded on a fresh cache.
The first unit is rebuilt by hand from its definition (560 zeros in front, 102 frames, fixed
floor, no prefix frames). Chunking consistency: buffered units, interleaved sessions and a
reset session must reproduce the one-by-one results bit for bit (same arithmetic, same order).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.reference_mel import reference_mel
from backends.audio.streaming_encoder import StreamingAudioEncoder
from backends.audio.streaming_mel import StreamingMel, StreamingMelConfig
from backends.models.whisper_mel import WhisperMel, normalize_log_mel

UNIT = 16000
NUM_UNITS = 40
RESET_UNIT = 29  # 29 * 50 cached + 52 new conv frames >= 1500 positions
# Hand-built and streamed paths differ only in which tensors are views: same kernels.
WIRING_TOLERANCE = 1e-6


def _audio(num_units: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(num_units * UNIT)).astype(np.float32)


@pytest.fixture(scope="module")
def run(tiny_model: AudioEncoderModel) -> tuple[list[torch.Tensor], list[int]]:
    encoder = StreamingAudioEncoder(tiny_model)
    embeddings, lengths = [], []
    for unit in np.split(_audio(NUM_UNITS, seed=0), NUM_UNITS):
        embeddings.append(encoder.encode_unit(unit))
        lengths.append(encoder.cache_length)
    return embeddings, lengths


def test_every_unit_yields_exactly_ten_embeddings(
    run: tuple[list[torch.Tensor], list[int]],
) -> None:
    embeddings, _ = run
    for index, rows in enumerate(embeddings):
        assert rows.shape == (10, 48) and rows.dtype == torch.float32, index
        assert torch.isfinite(rows).all(), index


def test_cache_resets_past_30_seconds(run: tuple[list[torch.Tensor], list[int]]) -> None:
    _, lengths = run
    expected = [50 * (k + 1) for k in range(RESET_UNIT)]
    expected += [50 * (k - RESET_UNIT + 1) for k in range(RESET_UNIT, NUM_UNITS)]
    assert lengths == expected


def test_reset_unit_equals_a_fresh_cache(
    tiny_model: AudioEncoderModel, run: tuple[list[torch.Tensor], list[int]]
) -> None:
    mel = StreamingMel(StreamingMelConfig(), WhisperMel())
    units = np.split(_audio(NUM_UNITS, seed=0), NUM_UNITS)
    chunk = [mel.push_unit(torch.from_numpy(u)) for u in units[: RESET_UNIT + 1]][-1]
    with torch.inference_mode():
        frames, _ = tiny_model.apm.forward_chunk(chunk, None, prefix_extra_frames=2,
                                                 suffix_extra_frames=2)
        expected = tiny_model.embed(frames)
    torch.testing.assert_close(run[0][RESET_UNIT], expected, rtol=0, atol=WIRING_TOLERANCE)


def test_first_unit_from_its_definition(tiny_model: AudioEncoderModel) -> None:
    unit = _audio(1, seed=3)
    padded = torch.from_numpy(np.concatenate([np.zeros(560, np.float32), unit])[:16480])
    mel = normalize_log_mel(WhisperMel().raw_frames(padded, 0, 102), -10.0)
    with torch.inference_mode():
        frames, _ = tiny_model.apm.forward_chunk(mel, None, prefix_extra_frames=0,
                                                 suffix_extra_frames=2)
        expected = tiny_model.embed(frames)
    ours = StreamingAudioEncoder(tiny_model).encode_unit(unit)
    torch.testing.assert_close(ours, expected, rtol=0, atol=WIRING_TOLERANCE)


def test_buffered_units_equal_one_by_one(tiny_model: AudioEncoderModel) -> None:
    audio = _audio(5, seed=1)
    one_by_one = StreamingAudioEncoder(tiny_model)
    expected = torch.cat([one_by_one.encode_unit(u) for u in np.split(audio, 5)])
    buffered = StreamingAudioEncoder(tiny_model).encode_units(audio)
    assert buffered.shape == (50, 48) and torch.equal(buffered, expected)


def test_sessions_are_isolated_and_deterministic(
    make_tiny_model: Callable[[int], AudioEncoderModel],
) -> None:
    model = make_tiny_model(0)
    first, second = np.split(_audio(4, seed=1), 4), np.split(_audio(4, seed=2), 4)
    alone = [StreamingAudioEncoder(model), StreamingAudioEncoder(make_tiny_model(0))]
    expected = [[alone[0].encode_unit(u) for u in first], [alone[1].encode_unit(u) for u in second]]
    sessions = [StreamingAudioEncoder(model), StreamingAudioEncoder(model)]
    for index in range(4):  # interleaved over one shared model
        assert torch.equal(sessions[0].encode_unit(first[index]), expected[0][index])
        assert torch.equal(sessions[1].encode_unit(second[index]), expected[1][index])


def test_reset_restarts_the_stream(tiny_model: AudioEncoderModel) -> None:
    units = np.split(_audio(3, seed=4), 3)
    encoder = StreamingAudioEncoder(tiny_model)
    before = [encoder.encode_unit(u) for u in units]
    encoder.reset()
    assert encoder.num_units == 0 and encoder.cache_length == 0
    assert all(torch.equal(encoder.encode_unit(u), b) for u, b in zip(units, before))


@pytest.mark.parametrize("num_samples,rows", [  # every sample kept, as the official
    (0, 0), (1280, 0), (1281, 1), (1600, 1), (48123, 30), (31 * UNIT, 310),
])
def test_reference_embedding_count(
    tiny_model: AudioEncoderModel, num_samples: int, rows: int,
) -> None:
    encoder = StreamingAudioEncoder(tiny_model)
    reference = encoder.encode_reference(_audio(31, seed=5)[:num_samples])
    assert reference.shape == (rows, 48) and encoder.num_units == 0


def test_reference_is_the_non_streaming_chunk_masked_path(tiny_model: AudioEncoderModel) -> None:
    clip = _audio(3, seed=6)[:47000]  # 294 mel frames, 147 encoder frames, 29 embeddings
    mel = reference_mel(WhisperMel(), torch.from_numpy(clip))
    with torch.inference_mode():
        expected = tiny_model.embed(tiny_model.apm(mel[None], chunk_frames=50)[0])
    reference = StreamingAudioEncoder(tiny_model).encode_reference(clip)
    assert reference.shape == (29, 48)
    torch.testing.assert_close(reference, expected, rtol=0, atol=WIRING_TOLERANCE)


@pytest.mark.parametrize("bad", [
    np.zeros(15999, np.float32), np.zeros(UNIT, np.float64), np.zeros((1, UNIT), np.float32),
    [0.0] * UNIT,
])
def test_encode_unit_rejects_bad_audio(tiny_model: AudioEncoderModel, bad: object) -> None:
    with pytest.raises(ValueError):
        StreamingAudioEncoder(tiny_model).encode_unit(bad)  # type: ignore[arg-type]


def test_encode_units_rejects_partial_units(tiny_model: AudioEncoderModel) -> None:
    with pytest.raises(ValueError, match="multiple"):
        StreamingAudioEncoder(tiny_model).encode_units(np.zeros(UNIT + 1, np.float32))


# Streamed and whole-clip paths attend over the same frames in different batch shapes; float32
# reassociation differs by ~1e-6 at these widths.
CHUNKING_TOLERANCE = 1e-4


def test_streamed_units_equal_the_whole_clip_with_the_chunk_mask(
    tiny_model: AudioEncoderModel,
) -> None:
    """End to end: 8 units streamed one by one (mel window, redundancy crop, KV cache, position
    offsets, projector, pool) equal the non-streaming encoder run once over the same mel with
    MiniCPM-o's 1 s block-causal mask, pooled as a whole: the chunking changes nothing."""
    units = np.split(_audio(8, seed=8), 8)
    mel = StreamingMel(StreamingMelConfig(), WhisperMel())
    chunks = [mel.push_unit(torch.from_numpy(u)) for u in units]
    # chunk k covers mel frames [100k - 2, 100k + 102): 2 redundant frames on each side
    whole = torch.cat([chunks[0]] + [chunk[:, 4:] for chunk in chunks[1:]], dim=1)
    assert whole.shape == (80, 802)
    with torch.inference_mode():
        frames = tiny_model.apm(whole[None], chunk_frames=50)[0, :400]
        expected = tiny_model.embed(frames)
    streamed = StreamingAudioEncoder(tiny_model).encode_units(np.concatenate(units))
    assert streamed.shape == expected.shape == (80, 48)
    torch.testing.assert_close(streamed, expected, rtol=0, atol=CHUNKING_TOLERANCE)
