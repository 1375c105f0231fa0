"""The tiny Token2Wav profile with fewer Euler steps: each step is a whole estimator pass and
a slice of every cache, so interpreted kernels cost time in proportion to the step count."""

from __future__ import annotations

import dataclasses

from backends.models.token2wav import Token2WavConfig


def tiny_with_steps(n_timesteps: int) -> Token2WavConfig:
    """`Token2WavConfig.tiny()` with `n_timesteps` Euler steps instead of the served ten."""
    tiny = Token2WavConfig.tiny()
    decoder = dataclasses.replace(tiny.flow.decoder, n_timesteps=n_timesteps)
    return dataclasses.replace(tiny, flow=dataclasses.replace(tiny.flow, decoder=decoder))
