"""One stream's window for `Token2Wav.decode`, and what decode refuses before any work: a
malformed window or a stream that cannot take one (ValueError naming the rule; nothing has
changed yet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backends.models.token2wav.config import Token2WavConfig
from backends.models.token2wav.estimator_pool import EstimatorPool
from backends.models.token2wav.stream import Token2WavStream


@dataclass(frozen=True, slots=True)
class StreamWindow:
    """One window of one stream for `Token2Wav.decode`."""

    stream: Token2WavStream
    codes: np.ndarray  # [n] int32 codes in [0, vocab_size); empty only when last_chunk
    last_chunk: bool


def validate_windows(windows: Sequence[StreamWindow], config: Token2WavConfig,
                     pool: EstimatorPool | None) -> None:
    lookahead = config.flow.encoder.pre_lookahead_len
    vocab = config.flow.vocab_size
    if len({id(w.stream) for w in windows}) != len(windows):
        raise ValueError("a stream may appear only once per decode")
    for window in windows:
        if window.stream.is_finished:
            raise ValueError("stream already finished by a final window")
        if (window.stream.cache_slot is not None or pool is not None) and not (
                pool is not None and pool.owns(window.stream.cache_slot)):
            raise ValueError("stream has no live slot in this model's cache pool "
                             "(released, or made before enable_cache_pool)")
        if not window.last_chunk and len(window.codes) <= lookahead:
            raise ValueError(
                f"chunk_below_lookahead_window: a non-final window needs more than "
                f"{lookahead} codes, got {len(window.codes)}"
            )
        if len(window.codes) and not (0 <= window.codes.min() and window.codes.max() < vocab):
            raise ValueError(f"codes must lie in [0, {vocab}), got {window.codes.tolist()}")
