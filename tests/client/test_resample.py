"""Tests for client/resample.py.

Strategy: cases whose interpolation positions are exact (rate ratios 2 and 1/3) have literal
expected outputs; the rest checks lengths, rounding, clipping and the errors.
"""

import numpy as np
import pytest

from client.resample import downmix_to_mono, resample_linear, to_uplink_pcm
from client.wav import WavAudio


def test_upsample_by_two_interpolates_midpoints_and_holds_the_end():
    samples = np.array([0, 100, 201], dtype=np.int16)
    out = resample_linear(samples, 8000, 16000)
    # positions 0, .5, 1, 1.5, 2, 2.5 -> the last one is held at the final sample; 150.5 -> 150
    # (round half to even).
    np.testing.assert_array_equal(out, [0, 50, 100, 150, 201, 201])
    assert out.dtype == np.int16


def test_downsample_by_three_picks_every_third_sample():
    samples = np.arange(-300, 300, 7, dtype=np.int16)  # 86 samples
    out = resample_linear(samples, 48000, 16000)
    np.testing.assert_array_equal(out, samples[: 86 * 16000 // 48000 * 3 : 3])


def test_output_length_is_floor_of_scaled_length():
    samples = np.zeros(44100 + 7, dtype=np.int16)
    assert resample_linear(samples, 44100, 16000).shape == ((44100 + 7) * 16000 // 44100,)


def test_same_rate_is_a_copy():
    samples = np.array([1, 2, 3], dtype=np.int16)
    out = resample_linear(samples, 16000, 16000)
    np.testing.assert_array_equal(out, samples)
    assert out is not samples


def test_empty_and_too_short_inputs_give_empty_output():
    assert resample_linear(np.zeros(0, dtype=np.int16), 8000, 16000).shape == (0,)
    assert resample_linear(np.array([5], dtype=np.int16), 48000, 16000).shape == (0,)


def test_extremes_survive():
    samples = np.array([32767, -32768, 32767], dtype=np.int16)
    out = resample_linear(samples, 16000, 32000)
    assert out.max() == 32767 and out.min() == -32768


def test_downmix_rounds_the_channel_mean():
    stereo = np.array([[1, 2], [-1, -2], [32767, 32767], [-32768, 32767]], dtype=np.int16)
    # means 1.5 -> 2, -1.5 -> -2 (half to even), 32767, -0.5 -> -0
    np.testing.assert_array_equal(downmix_to_mono(stereo), [2, -2, 32767, 0])


def test_to_uplink_pcm_converts_stereo_8k():
    audio = WavAudio(np.array([[0, 0], [100, 300]], dtype=np.int16), 8000)
    np.testing.assert_array_equal(to_uplink_pcm(audio), [0, 100, 200, 200])


@pytest.mark.parametrize(
    ("samples", "src", "dst", "message"),
    [
        (np.zeros((2, 2), dtype=np.int16), 8000, 16000, "mono"),
        (np.zeros(4, dtype=np.int16), 0, 16000, "rates must be > 0"),
    ],
)
def test_resample_errors(samples, src, dst, message):
    with pytest.raises(ValueError, match=message):
        resample_linear(samples, src, dst)
