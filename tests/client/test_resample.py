"""Tests for client/resample.py.

Strategy: tones measured by their spectrum. A tone in the speech band survives any rate
change at its amplitude; a tone above the new Nyquist frequency (8 kHz) is filtered out, where
resampling without an anti-alias filter would fold it back into the band (12 kHz at 48 kHz to
4 kHz at 16 kHz). The rest checks lengths, clipping, the downmix and the errors.
"""

import numpy as np
import pytest

from client.resample import UPLINK_SAMPLE_RATE, downmix_to_mono, resample, to_uplink_pcm
from client.wav import WavAudio


def tone(freq_hz: float, rate: int, seconds: float = 1.0, amplitude: float = 10000.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * freq_hz * t)).astype(np.int16)


def amplitude_at(samples: np.ndarray, rate: int, freq_hz: float) -> float:
    """The amplitude of the `freq_hz` component (a Hann-windowed DFT bin, edges trimmed)."""
    core = samples[rate // 10: -rate // 10].astype(np.float64)
    window = np.hanning(core.size)
    spectrum = np.abs(np.fft.rfft(core * window)) * 2 / window.sum()
    freqs = np.fft.rfftfreq(core.size, 1 / rate)
    return float(spectrum[np.abs(freqs - freq_hz) < 20].max())


@pytest.mark.parametrize("src", [8000, 22050, 44100, 48000])
def test_a_speech_band_tone_keeps_its_amplitude(src):
    out = resample(tone(1000, src), src, UPLINK_SAMPLE_RATE)
    assert abs(out.shape[0] - UPLINK_SAMPLE_RATE) <= 1
    assert amplitude_at(out, UPLINK_SAMPLE_RATE, 1000) == pytest.approx(10000, rel=0.02)


@pytest.mark.parametrize("src, freq, alias", [(48000, 12000, 4000), (44100, 10000, 6000)])
def test_a_tone_above_8_khz_is_filtered_not_folded_back(src, freq, alias):
    out = resample(tone(freq, src), src, UPLINK_SAMPLE_RATE)
    assert amplitude_at(out, UPLINK_SAMPLE_RATE, alias) < 10000 * 1e-3  # below -60 dB


def test_same_rate_is_a_copy():
    samples = np.array([1, 2, 3], dtype=np.int16)
    out = resample(samples, 16000, 16000)
    np.testing.assert_array_equal(out, samples)
    assert out is not samples


def test_empty_input_gives_empty_output():
    assert resample(np.zeros(0, dtype=np.int16), 8000, 16000).shape == (0,)


def test_full_scale_clips_instead_of_wrapping():
    square = np.tile(np.array([32767] * 8 + [-32768] * 8, dtype=np.int16), 200)  # overshoots when filtered
    out = resample(square, 48000, 16000)
    assert out.dtype == np.int16 and out.max() == 32767 and out.min() == -32768


def test_downmix_rounds_the_channel_mean():
    stereo = np.array([[1, 2], [-1, -2], [32767, 32767], [-32768, 32767]], dtype=np.int16)
    # means 1.5 -> 2, -1.5 -> -2 (half to even), 32767, -0.5 -> -0
    np.testing.assert_array_equal(downmix_to_mono(stereo), [2, -2, 32767, 0])


def test_to_uplink_pcm_converts_stereo_48k():
    left = tone(440, 48000)
    audio = WavAudio(np.stack([left, left], axis=1), 48000)
    out = to_uplink_pcm(audio)
    assert abs(out.shape[0] - 16000) <= 1
    assert amplitude_at(out, 16000, 440) == pytest.approx(10000, rel=0.02)


@pytest.mark.parametrize(
    ("samples", "src", "dst", "message"),
    [
        (np.zeros((2, 2), dtype=np.int16), 8000, 16000, "mono"),
        (np.zeros(4, dtype=np.int16), 0, 16000, "rates must be > 0"),
    ],
)
def test_resample_errors(samples, src, dst, message):
    with pytest.raises(ValueError, match=message):
        resample(samples, src, dst)
