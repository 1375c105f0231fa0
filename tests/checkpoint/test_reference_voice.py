"""Tests for backends/checkpoint/reference_voice.py.

Strategy: the stand-in voice must have the real prompt's length and behave like speech for
the prompt path: a pitch that moves within the speaking range, loud and quiet stretches at
syllable rate, and the same samples for the same seed. Pitch is measured per 40 ms voiced
frame by autocorrelation.
"""

from __future__ import annotations

import numpy as np

from backends.checkpoint.reference_voice import REFERENCE_VOICE_SAMPLE_RATE, synthesize_reference_voice

SR = REFERENCE_VOICE_SAMPLE_RATE
FRAME = SR // 25  # 40 ms analysis frames: several pitch periods at 80 Hz and above
MIN_PITCH_SPREAD_HZ = 10.0  # the contour's wobbles span ~50 Hz; a flat tone spreads ~0
QUIET = 0.05  # frame RMS below this fraction of the loudest frame counts as a pause


def _frames(x: np.ndarray) -> np.ndarray:
    n = x.size // FRAME
    return x[: n * FRAME].reshape(n, FRAME)


def _pitch(frame: np.ndarray) -> float:
    ac = np.correlate(frame, frame, mode="full")[FRAME - 1:]
    lo, hi = SR // 300, SR // 70  # lags of 300 Hz .. 70 Hz
    return SR / (lo + int(np.argmax(ac[lo:hi])))


def test_length_range_and_determinism() -> None:
    voice = synthesize_reference_voice(seed=0)
    assert voice.dtype == np.float32 and voice.shape == (96256,)  # 6.016 s at 16 kHz
    assert np.isclose(np.max(np.abs(voice)), 0.6)
    assert np.array_equal(voice, synthesize_reference_voice(seed=0))
    assert not np.array_equal(voice, synthesize_reference_voice(seed=1))


def test_speech_like_loudness_and_pitch() -> None:
    frames = _frames(synthesize_reference_voice(seed=0).astype(np.float64))
    rms = np.sqrt(np.mean(frames**2, axis=1))
    quiet = rms < QUIET * rms.max()
    assert 0.05 < quiet.mean() < 0.6, f"pause fraction {quiet.mean():.2f}"
    voiced = frames[rms > 0.5 * rms.max()]
    pitches = np.array([_pitch(f) for f in voiced])
    assert np.all((pitches > 80) & (pitches < 250)), pitches
    assert np.ptp(pitches) > MIN_PITCH_SPREAD_HZ, f"pitch spread {np.ptp(pitches):.1f} Hz"
