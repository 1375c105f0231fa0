"""Backbone parity with the official MiniCPM-o 4.5 code on checkpoints its classes wrote.

Strategy: `build_official.py` (in .venv-official) writes tiny checkpoints with
`MiniCPMO.save_pretrained` and records the official outputs for fixed inputs; here our loader
reads the same directories and our models compute the same outputs (tests/official/ours.py).
Three variants: float32 shards in float32; bf16 shards in float32 (a CPU server over a bf16
checkpoint: our weights must be exactly the official upcast ones, the Talker's weight-norm
head included); bf16 shards in bf16 (the official duplex dtype, compared at bf16 tolerance).
The official decoding of the Talker is made greedy by replacing its draw with an argmax.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from official_outputs import OfficialOutputs
from ours import Ours, reference_voice_rows, streaming_audio_rows, talker_greedy, thinker_logits

# variant -> (stored dtype, our compute dtype, tolerance as a fraction of the reference's peak)
VARIANTS = {
    "float32": ("float32", torch.float32, 2e-6),
    "bfloat16-in-float32": ("bfloat16", torch.float32, 2e-6),
    "bfloat16": ("bfloat16", torch.bfloat16, 2e-2),  # a few bf16 ulps of the largest value
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def ours(variant: str, served: Callable[[str], Path]) -> Ours:
    stored, dtype, _ = VARIANTS[variant]
    return Ours.load(served(stored), dtype)


def _assert_close(got: np.ndarray, want: np.ndarray, variant: str, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: -inf entries differ"
    peak = float(np.abs(want[finite]).max())
    diff = float(np.abs(got[finite] - want[finite]).max())
    tolerance = VARIANTS[variant][2] * max(peak, 1.0)
    assert diff <= tolerance, f"{what}: max abs diff {diff:.3g} > {tolerance:.3g} (peak {peak:.3g})"


def test_thinker_logits(official: OfficialOutputs, ours: Ours, variant: str) -> None:
    ref = official.arrays("thinker", variant)
    got = thinker_logits(ours, ref["input_ids"], ref["logits"].shape[0])
    _assert_close(got, ref["logits"], variant, "Thinker logits")
    assert np.array_equal(got.argmax(-1), ref["logits"].argmax(-1))


# bf16 shards in float32 are the same weights upcast, which the reference rows already check
@pytest.mark.parametrize("variant", ["float32", "bfloat16"], indirect=True)
def test_streaming_audio_rows(official: OfficialOutputs, ours: Ours, variant: str) -> None:
    """32 one-second units through the duplex streaming path: the exact-mode mel with its
    30 s slide, the encoder KV cache with its reset at the position table, projector, pool."""
    ref = official.arrays("streaming_audio", variant)
    assert ref["rows"].shape[0] >= 32
    got = streaming_audio_rows(ours, ref["audio"])
    _assert_close(got, ref["rows"], variant, "streaming audio rows")


def test_reference_voice_rows_keep_every_sample(official: OfficialOutputs, ours: Ours,
                                                variant: str) -> None:
    ref, lengths = official.arrays("reference_voice", variant), official.values("reference_voice", variant)["lengths"]
    assert all(n % 1600 for n in lengths)
    for i, length in enumerate(lengths):
        clip = ref[f"clip{i}"]
        assert clip.shape == (length,)
        _assert_close(reference_voice_rows(ours, clip), ref[f"rows{i}"], variant,
                      f"reference rows of a {length}-sample clip")


def test_talker_condition_logits_and_greedy_codes(official: OfficialOutputs, ours: Ours,
                                                  variant: str) -> None:
    """The checkpoint says normalize_projected_hidden: false; the official duplex condition
    normalises anyway, and so do we."""
    ref = official.arrays("talker", variant)
    steps = ref["logits"].shape[0]
    condition, logits, codes = talker_greedy(ours, ref["ids"], ref["hidden"], steps)
    _assert_close(condition, ref["condition"], variant, "Talker condition")
    _assert_close(logits, ref["logits"], variant, "Talker logits")
    np.testing.assert_array_equal(codes, ref["codes"])
