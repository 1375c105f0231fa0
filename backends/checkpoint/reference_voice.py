"""A deterministic, voice-like stand-in for the checkpoint's default reference voice.

The real `assets/HT_ref_audio.wav` is a recorded speaker; the tiny checkpoint needs a file of
the same length whose content behaves like speech for the prompt path (pitch that moves,
harmonics, syllable-rate loudness changes, short pauses), not silence or a pure tone.
"""

from __future__ import annotations

import numpy as np

REFERENCE_VOICE_SECONDS = 6.016  # length of the real default prompt
REFERENCE_VOICE_SAMPLE_RATE = 16_000  # the encoder/prompt rate; 6.016 s is 96256 samples
_NUM_HARMONICS = 12
_PEAK = 0.6  # headroom below full scale


def synthesize_reference_voice(seed: int, sample_rate: int = REFERENCE_VOICE_SAMPLE_RATE,
                               seconds: float = REFERENCE_VOICE_SECONDS) -> np.ndarray:
    """Return [round(seconds * sample_rate)] float32 samples in [-_PEAK, _PEAK]."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * sample_rate), dtype=np.float64) / sample_rate
    f0 = _pitch_contour(t, rng)  # [num_samples] Hz
    phase = 2.0 * np.pi * np.cumsum(f0) / sample_rate
    voiced = _harmonics(phase, float(f0.mean()), rng)
    breath = rng.standard_normal(t.size) * 0.02  # aspiration noise, as in breathy speech
    signal = (voiced + breath) * _syllable_envelope(t, rng)
    return (signal / np.max(np.abs(signal)) * _PEAK).astype(np.float32)


def _pitch_contour(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """F0 in Hz: a slow declination plus two intonation wobbles, around a seeded base pitch."""
    base = 120.0 + 40.0 * rng.random()
    wobble = 18.0 * np.sin(2 * np.pi * 0.35 * t + 2 * np.pi * rng.random())
    wobble += 8.0 * np.sin(2 * np.pi * 1.7 * t + 2 * np.pi * rng.random())
    return base + wobble - 4.0 * t


def _harmonics(phase: np.ndarray, f0_mean: float, rng: np.random.Generator) -> np.ndarray:
    """Sum of harmonics shaped by two fixed formant-like resonances."""
    formants = (500.0 + 300.0 * rng.random(), 1500.0 + 600.0 * rng.random())
    out = np.zeros_like(phase)
    for k in range(1, _NUM_HARMONICS + 1):
        freq = k * f0_mean
        gain = sum(np.exp(-(((freq - f) / 250.0) ** 2)) for f in formants) + 0.3 / k
        out += gain * np.sin(k * phase)
    return out


def _syllable_envelope(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Loudness at ~4 syllables/s with a seeded pause pattern (every few syllables a gap)."""
    rate = 3.5 + rng.random()
    syllable = np.floor(t * rate).astype(np.int64)
    pauses = rng.random(int(syllable.max()) + 1) < 0.2
    within = np.sin(np.pi * (t * rate - syllable)) ** 2
    env = np.where(pauses[syllable], 0.02, within)
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.05)  # no click at either end
    return env * fade
