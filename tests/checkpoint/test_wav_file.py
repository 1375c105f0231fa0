"""Tests for backends/checkpoint/wav_file.py.

Strategy: round-trip float samples through 16-bit PCM within one quantisation step, and
decode hand-made files of the other integer widths and of several channels against known
values; a float wav must be refused with a clear message rather than misread.
"""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from backends.checkpoint.wav_file import read_wav, write_wav_pcm16

# Half a step of rounding plus up to one step from the scale difference (writer x32767,
# reader /32768, the usual conventions).
PCM16_TOLERANCE = 1.5 / 32767


def test_pcm16_round_trip(tmp_path: Path) -> None:
    samples = np.linspace(-1.0, 1.0, 1001, dtype=np.float32)
    write_wav_pcm16(tmp_path / "a.wav", samples, 24000)
    back, rate = read_wav(tmp_path / "a.wav")
    assert rate == 24000 and back.dtype == np.float32 and back.shape == samples.shape
    assert np.max(np.abs(back - samples)) <= PCM16_TOLERANCE


def test_writer_clips_and_rejects_multichannel(tmp_path: Path) -> None:
    write_wav_pcm16(tmp_path / "a.wav", np.array([2.0, -3.0], dtype=np.float32), 16000)
    back, _ = read_wav(tmp_path / "a.wav")
    assert np.allclose(back, [32767 / 32768, -32767 / 32768])
    with pytest.raises(ValueError, match="expected mono"):
        write_wav_pcm16(tmp_path / "b.wav", np.zeros((2, 4), dtype=np.float32), 16000)


def _write_raw(path: Path, width: int, channels: int, frames: bytes) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(8000)
        out.writeframes(frames)


def test_other_widths_and_channels(tmp_path: Path) -> None:
    _write_raw(tmp_path / "u8.wav", 1, 1, bytes([0, 128, 192]))
    assert np.allclose(read_wav(tmp_path / "u8.wav")[0], [-1.0, 0.0, 0.5])
    _write_raw(tmp_path / "s24.wav", 3, 1, bytes([0, 0, 0x40, 0, 0, 0xC0]))  # +0.5, -0.5
    assert np.allclose(read_wav(tmp_path / "s24.wav")[0], [0.5, -0.5])
    _write_raw(tmp_path / "st.wav", 2, 2, struct.pack("<4h", 16384, 0, -16384, -16384))
    assert np.allclose(read_wav(tmp_path / "st.wav")[0], [0.25, -0.5])


def test_float_wav_is_refused(tmp_path: Path) -> None:
    data = np.zeros(4, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)  # format 3 = IEEE float
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    (tmp_path / "f.wav").write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    with pytest.raises(ValueError, match="not an integer-PCM wav"):
        read_wav(tmp_path / "f.wav")
