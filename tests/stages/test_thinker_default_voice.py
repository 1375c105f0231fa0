"""The Thinker stage hears the checkpoint's default voice when a session gives no REF_AUDIO
(as the official demo feeds its default clip), at 16 kHz whatever the file's rate, and random
weights get the listen-on-silence option by default (their decisions mean nothing)."""

from __future__ import annotations

import numpy as np

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE
from backends.stages.factory import build_thinker_engine, thinker_default_voice


class _Voiced:
    """A checkpoint whose default voice file is `seconds` of a 440 Hz tone at `rate`."""

    def __init__(self, rate: int, seconds: float) -> None:
        t = np.arange(int(rate * seconds)) / rate
        self.audio, self.rate = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate

    def reference_voice(self) -> tuple[np.ndarray, int]:
        return self.audio, self.rate


def test_the_default_voice_reaches_the_thinker_at_16_khz() -> None:
    for rate in (16000, 24000):
        voice = thinker_default_voice(_Voiced(rate, 1.5))  # type: ignore[arg-type]
        assert voice.dtype == np.float32 and voice.ndim == 1
        assert abs(len(voice) - 1.5 * REFERENCE_VOICE_SAMPLE_RATE) <= 1, (rate, len(voice))
        spectrum = np.abs(np.fft.rfft(voice))
        assert abs(np.argmax(spectrum) / 1.5 - 440) < 2  # the same tone, resampled


def test_the_tiny_profile_feeds_its_voice_and_listens_on_silence() -> None:
    engine = build_thinker_engine({"checkpoint": "tiny", "max_sessions": "2"})
    assert engine.default_voice is not None and len(engine.default_voice) > 16000
    assert engine.config.listen_when_silent
