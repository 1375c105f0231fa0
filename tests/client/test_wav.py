"""Tests for client/wav.py and the bundled demo input.

Strategy: write/read round trips must be bit exact (PCM16 is lossless); other sample formats
and containers (8/24-bit and float wav, FLAC) read as the same int16 values, which the stdlib
`wave` module writes or checks independently; a file that is no audio raises ValueError.
"""

import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile

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


def _stdlib_wav(path, width: int, frames: bytes) -> None:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(width)
        writer.setframerate(16000)
        writer.writeframes(frames)


def test_8_bit_wav_reads_as_int16(tmp_path):
    _stdlib_wav(tmp_path / "u8.wav", 1, bytes([0, 128, 255]))  # unsigned: -1, 0, 127/128
    np.testing.assert_array_equal(read_wav(tmp_path / "u8.wav").samples[:, 0], [-32768, 0, 32512])


def test_24_bit_wav_keeps_its_top_16_bits_rounded(tmp_path):
    values = [0x123456, -0x123456 & 0xFFFFFF, 0x7FFFFF, 0x000080]
    _stdlib_wav(tmp_path / "s24.wav", 3, b"".join(v.to_bytes(3, "little") for v in values))
    np.testing.assert_array_equal(read_wav(tmp_path / "s24.wav").samples[:, 0], [0x1234, -0x1234, 32767, 0])


def test_float_wav_and_flac_read_as_the_same_int16(tmp_path):
    samples = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    soundfile.write(str(tmp_path / "f.wav"), samples.astype(np.float32) / 32768.0, 16000, subtype="FLOAT")
    write_wav(tmp_path / "a.flac", samples, 16000)
    assert soundfile.info(str(tmp_path / "a.flac")).format == "FLAC"
    for name in ("f.wav", "a.flac"):
        np.testing.assert_array_equal(read_wav(tmp_path / name).samples[:, 0], samples)


def test_float_beyond_full_scale_clips_instead_of_wrapping(tmp_path):
    soundfile.write(str(tmp_path / "loud.wav"), np.array([1.5, -1.5], np.float32), 16000, subtype="FLOAT")
    np.testing.assert_array_equal(read_wav(tmp_path / "loud.wav").samples[:, 0], [32767, -32768])


def test_rejects_non_audio(tmp_path):
    (tmp_path / "x.wav").write_bytes(b"not a riff file at all")
    with pytest.raises(ValueError, match="not an audio file libsndfile can read"):
        read_wav(tmp_path / "x.wav")


def test_an_unknown_extension_is_written_as_wav(tmp_path):
    write_wav(tmp_path / "reply.pcm16", np.array([1, 2], np.int16), 24000)
    assert soundfile.info(str(tmp_path / "reply.pcm16")).format == "WAV"


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
