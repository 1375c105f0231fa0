"""Batched streaming encode (backends/audio/batched_encoder.py) against the serial one.

Strategy: twin sessions over the same tiny tower, one pair per session: one twin is encoded
unit by unit (`encode_unit`), the other in batches with the others (`encode_units_batched`).
The sessions start at different stream ages (their first unit, mid-stream, just before and
after the cache restart) and run several batched steps on random audio; every unit's rows and
every cache afterwards (length and held keys/values) must equal the serial twin's. A tower with
a position table of 200 restarts the cache every 3 units (unit 4, then 7, 10, ...), so the
batches mix restarting and non-restarting rows. Failures: a bad unit or a failing mel step ends
only its session; a failing batched forward falls back to the serial path with nothing
committed twice.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from backends.audio import batched_encoder
from backends.audio.batched_encoder import encode_units_batched
from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.streaming_encoder import StreamingAudioEncoder
from backends.models.whisper_encoder import WhisperEncoderConfig
from encoder_twins import assert_same_cache, make_twins, random_units

SMALL_TABLE = WhisperEncoderConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                   encoder_ffn_dim=256, num_mel_bins=80, max_source_positions=200)
# Batched matmuls and the masked (padded) attention sum in another order than batch 1.
RTOL, ATOL = 1e-5, 1e-6
AGES = [0, 1, 2, 3, 4, 6, 9, 13]  # units already encoded per session when batching starts
STEPS = 5


@pytest.fixture(scope="module")
def small_table_model() -> AudioEncoderModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return AudioEncoderModel.from_config(SMALL_TABLE, 48)


def _twins(model: AudioEncoderModel, ages: list[int]):
    """Per session: (serial twin, batched twin, its audio), both twins already `age` units in."""
    return make_twins(lambda: (StreamingAudioEncoder(model), StreamingAudioEncoder(model)),
                      ages, STEPS, seed=100)


def _assert_same_cache(got: StreamingAudioEncoder, want: StreamingAudioEncoder) -> None:
    assert_same_cache(got, want, RTOL, ATOL)


def _run_step(twins, step: int, min_batch: int = 2) -> None:
    want = [serial.encode_unit(audio[step]) for serial, _, audio in twins]
    got = encode_units_batched([b for _, b, _ in twins], [a[step] for _, _, a in twins],
                               min_batch=min_batch)
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and g.shape == w.shape == (10, 48)
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    for serial, batched, _ in twins:
        _assert_same_cache(batched, serial)


def _run_steps(twins) -> None:
    for step in range(STEPS):
        _run_step(twins, step)


@pytest.mark.parametrize("ages", [[5], [0, 3, 9], AGES], ids=["1", "3", "8"])
def test_batched_equals_serial_across_the_cache_restart(
    small_table_model: AudioEncoderModel, ages: list[int],
) -> None:
    twins = _twins(small_table_model, ages)
    lengths = []
    for step in range(STEPS):
        lengths.append([b.cache_length for _, b, _ in twins])
        _run_step(twins, step, min_batch=1)  # batch even one session
    if len(ages) > 1:  # some row restarted (its length fell) while others grew
        assert any(b < a for a, b in zip(lengths[0], lengths[-1]))


def test_batched_equals_serial_with_the_real_table(tiny_model: AudioEncoderModel) -> None:
    # 1500 positions: the 30th unit (index 29) restarts the cache
    _run_steps(_twins(tiny_model, [0, 26, 27, 28]))


def test_two_models_form_two_batches(
    tiny_model: AudioEncoderModel, small_table_model: AudioEncoderModel, monkeypatch,
) -> None:
    sizes = []
    real = batched_encoder._forward_batch
    monkeypatch.setattr(batched_encoder, "_forward_batch",
                        lambda batch: (sizes.append(len(batch)), real(batch))[1])
    twins = _twins(tiny_model, [0, 2, 4]) + _twins(small_table_model, [1, 5])
    _run_steps(twins)
    assert sizes == [3, 2] * STEPS or sizes == [2, 3] * STEPS


def test_a_bad_unit_fails_only_its_session(small_table_model: AudioEncoderModel) -> None:
    twins = _twins(small_table_model, [0, 2, 4])
    units = [a[0] for _, _, a in twins]
    units[1] = units[1][:-1]  # one sample short
    got = encode_units_batched([b for _, b, _ in twins], units)
    assert isinstance(got[1], ValueError)
    for index in (0, 2):
        serial = twins[index][0]
        torch.testing.assert_close(got[index], serial.encode_unit(units[index]),
                                   rtol=RTOL, atol=ATOL)
        _assert_same_cache(twins[index][1], serial)


def test_a_failing_mel_step_fails_only_its_session(small_table_model: AudioEncoderModel) -> None:
    twins = _twins(small_table_model, [1, 3, 5])

    def broken(samples: np.ndarray):
        raise RuntimeError("injected mel failure")

    twins[0][1].take_unit = broken  # type: ignore[method-assign]
    got = encode_units_batched([b for _, b, _ in twins], [a[0] for _, _, a in twins])
    assert isinstance(got[0], RuntimeError) and "injected" in str(got[0])
    for index in (1, 2):
        serial, batched, audio = twins[index]
        torch.testing.assert_close(got[index], serial.encode_unit(audio[0]), rtol=RTOL, atol=ATOL)
        _assert_same_cache(batched, serial)


def test_a_failing_batched_forward_falls_back_to_serial(
    small_table_model: AudioEncoderModel, monkeypatch,
) -> None:
    def fail(self: batched_encoder.BatchedKV) -> None:
        raise RuntimeError("injected commit failure")

    monkeypatch.setattr(batched_encoder.BatchedKV, "commit", fail)
    twins = _twins(small_table_model, [0, 3, 6])  # 3 restarts on its first batched unit
    _run_steps(twins)  # exact: the serial fallback gives the very serial arithmetic


def test_sessions_must_be_distinct(small_table_model: AudioEncoderModel) -> None:
    encoder = StreamingAudioEncoder(small_table_model)
    unit = random_units(1, seed=0)[0]
    with pytest.raises(ValueError, match="distinct"):
        encode_units_batched([encoder, encoder], [unit, unit])


def test_batched_kv_masks_each_row_to_its_own_length(
    make_tiny_model: Callable[[int], AudioEncoderModel],
) -> None:
    model = make_tiny_model(0)
    caches = [model.apm.cache_for(None, 52) for _ in range(2)]
    caches[0].length, caches[1].length = 100, 30
    store = batched_encoder.BatchedKV(caches, 50)
    assert store.end == 150 and store.positions[1].tolist() == list(range(30, 80))
    assert store.mask.shape == (2, 1, 1, 150)
    assert store.mask[0].sum() == 150 and store.mask[1].sum() == 80
