"""Helpers shared by the tests that hold two streaming encoders of one session to each other
(batched vs serial, graphed vs plain)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from backends.audio.streaming_encoder import StreamingAudioEncoder

UNIT = 16000  # one 1 s unit at 16 kHz


def random_units(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(UNIT)).astype(np.float32) for _ in range(count)]


def assert_same_cache(got: StreamingAudioEncoder, want: StreamingAudioEncoder,
                      rtol: float, atol: float) -> None:
    """Same stream position and the same held keys/values."""
    assert got.cache_length == want.cache_length and got.num_units == want.num_units
    length = want.cache_length
    for name in ("keys", "values"):
        torch.testing.assert_close(getattr(got._cache, name)[:, :, :length],
                                   getattr(want._cache, name)[:, :, :length],
                                   rtol=rtol, atol=atol)


Twins = list[tuple[StreamingAudioEncoder, StreamingAudioEncoder, list[np.ndarray]]]


def make_twins(make: Callable[[], tuple[StreamingAudioEncoder, StreamingAudioEncoder]],
               ages: list[int], steps: int, seed: int) -> Twins:
    """Per session: (reference twin, twin under test, its next `steps` units), both twins
    already fed `age` units of the session's audio one by one."""
    twins = []
    for index, age in enumerate(ages):
        audio = random_units(age + steps, seed=seed + index)
        reference, tested = make()
        for unit in audio[:age]:
            reference.encode_unit(unit)
            tested.encode_unit(unit)
        twins.append((reference, tested, audio[age:]))
    return twins
