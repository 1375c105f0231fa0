"""perf/voices.py: the committed reference voices are exactly what the generator writes."""
from __future__ import annotations

from perf.voices import VOICE_SEEDS, VOICES_DIR, voice_path, write_voices


def test_committed_voices_match_a_fresh_generation(tmp_path):
    fresh = write_voices(tmp_path)
    assert len(fresh) == len(VOICE_SEEDS)
    for seed, path in zip(VOICE_SEEDS, fresh):
        assert voice_path(seed, VOICES_DIR).read_bytes() == path.read_bytes()


def test_seeds_give_different_voices(tmp_path):
    first, second = write_voices(tmp_path, VOICE_SEEDS[:2])
    assert first.read_bytes() != second.read_bytes()
