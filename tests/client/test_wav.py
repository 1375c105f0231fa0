"""Tests for client/wav.py and the bundled demo input.

Strategy: write/read round trips must be bit exact (PCM16 is lossless); every unsupported
file (other sample widths, not a wav) raises ValueError with a message naming the problem.
"""

import wave
from pathlib import Path

import numpy as np
import pytest

from client.wav import WavAudio, read_wav, write_wav

DEMO_WAV = Path(__file__).resolve().parents[2] / "client" / "data" / "hello_16k.wav"
DEMO_MAX_BYTES = 100 * 1024  # the brief's size budget for a committed binary
DEMO_MIN_PEAK = 3000  # espeak-ng speech normalised to -3 dBFS peaks near 23000


def test_mono_round_trip_is_exact(tmp_path):
    samples = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    write_wav(tmp_path / "a.wav", samples, 24000)
    audio = read_wav(tmp_path / "a.wav")
    assert audio.sample_rate == 24000 and audio.num_channels == 1
    np.testing.assert_array_equal(audio.samples[:, 0], samples)


def test_stereo_round_trip_keeps_interleaving(tmp_path):
    samples = np.array([[1, -1], [2, -2], [3, -3]], dtype=np.int16)
    write_wav(tmp_path / "s.wav", samples, 8000)
    audio = read_wav(tmp_path / "s.wav")
    np.testing.assert_array_equal(audio.samples, samples)
    assert audio.duration_s == 3 / 8000


def test_empty_round_trip(tmp_path):
    write_wav(tmp_path / "e.wav", np.zeros(0, dtype=np.int16), 16000)
    assert read_wav(tmp_path / "e.wav").samples.shape == (0, 1)


def test_rejects_8_bit_wav(tmp_path):
    with wave.open(str(tmp_path / "u8.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(1)
        writer.setframerate(16000)
        writer.writeframes(bytes(100))
    with pytest.raises(ValueError, match="8-bit"):
        read_wav(tmp_path / "u8.wav")


def test_rejects_non_wav(tmp_path):
    (tmp_path / "x.wav").write_bytes(b"not a riff file at all")
    with pytest.raises(ValueError, match="not a PCM16 wav"):
        read_wav(tmp_path / "x.wav")


@pytest.mark.parametrize(
    "samples", [np.zeros(4, dtype=np.float32), np.zeros((2, 2, 2), dtype=np.int16)]
)
def test_write_rejects_wrong_dtype_or_rank(tmp_path, samples):
    with pytest.raises(ValueError, match="int16"):
        write_wav(tmp_path / "bad.wav", samples, 16000)


def test_wav_audio_validates():
    with pytest.raises(ValueError, match="int16"):
        WavAudio(np.zeros(4, dtype=np.int16), 16000)  # must be [frames, channels]
    with pytest.raises(ValueError, match="sample_rate"):
        WavAudio(np.zeros((4, 1), dtype=np.int16), 0)


def test_bundled_demo_input_matches_the_uplink_format():
    audio = read_wav(DEMO_WAV)
    assert (audio.sample_rate, audio.num_channels) == (16000, 1)
    assert 2.0 <= audio.duration_s <= 4.0
    assert DEMO_WAV.stat().st_size <= DEMO_MAX_BYTES
    assert int(np.abs(audio.samples.astype(np.int32)).max()) >= DEMO_MIN_PEAK
