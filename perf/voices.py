"""The benchmark's reference voices: deterministic voice-like clips, one wav per seed.

    python -m perf.voices            # (re)writes perf/data/voices/voice_<seed>.wav

Each clip is `synthesize_reference_voice(seed)` (the stand-in of the checkpoint's default
voice: moving pitch, harmonics, syllable-rate loudness) cut to VOICE_SECONDS at 16 kHz, the
rate REF_AUDIO is sent at. The same seed always gives the same bytes, so the committed files
can be checked against a fresh generation.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from backends.checkpoint.reference_voice import synthesize_reference_voice

VOICES_DIR = Path(__file__).resolve().parent / "data" / "voices"
VOICE_SEEDS = (11, 12, 13, 14)
VOICE_SECONDS = 3.0  # Seed-TTS prompt clips are a few seconds long
SAMPLE_RATE = 16000  # REF_AUDIO rate


def voice_pcm16(seed: int, seconds: float = VOICE_SECONDS) -> np.ndarray:
    """[round(seconds * 16000)] int16: the clip of one seed."""
    samples = synthesize_reference_voice(seed, SAMPLE_RATE, seconds)
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def voice_path(seed: int, directory: Path = VOICES_DIR) -> Path:
    return directory / f"voice_{seed}.wav"


def write_voices(directory: Path = VOICES_DIR, seeds: tuple[int, ...] = VOICE_SEEDS) -> list[Path]:
    from client.wav import write_wav

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = voice_path(seed, directory)
        write_wav(path, voice_pcm16(seed), SAMPLE_RATE)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=VOICES_DIR)
    args = parser.parse_args(argv)
    for path in write_voices(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
