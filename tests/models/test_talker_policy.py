"""Talker chunk budgets and the windowed frequency penalty (docs/model_facts.md#talker-chunks,
docs/architecture.md edge case 5).

Strategy: drive `TalkerChunkPolicy` through the runner's real `sample_token` with scripted
logits that make the "model" want EOS at chosen steps (EOS logit far above the rest) or never
(far below), then count the frames a chunk forwards. Budgets are exact host logic, so every
assertion is exact. The penalty is checked against a hand-computed formula.
"""

from __future__ import annotations

import pytest
import torch

from backends.models.talker_policy import (
    CHUNK_BUDGETS,
    CODEC_EOS,
    ChunkKind,
    TalkerChunkPolicy,
    TalkerSamplingConfig,
    apply_frequency_penalty,
)
from backends.runner.sampler import sample_token
from backends.runner.types import SampleContext, SamplingParams

VOCAB = CODEC_EOS + 1
WANT, AVOID = 50.0, -50.0  # EOS logit when the scripted model wants / does not want to stop
GREEDY = SamplingParams()  # temperature 0: the frame drawn is the argmax, deterministic


def _logits(step: int, want_eos: set[int]) -> torch.Tensor:
    """[VOCAB] float32: a distinct favourite code per step, EOS on top at `want_eos` steps."""
    logits = torch.zeros(VOCAB)
    logits[step % 100] = 10.0  # steps cycle codes so the penalty never decides the argmax
    logits[CODEC_EOS] = WANT if step in want_eos else AVOID
    return logits


def _run_chunk(policy: TalkerChunkPolicy, kind: ChunkKind, want_eos: set[int]) -> list[int]:
    """Sample until EOS; returns the forwarded frames (EOS excluded)."""
    policy.begin_chunk(kind)
    frames: list[int] = []
    for step in range(1000):
        ctx = SampleContext("r", step, [])
        token = sample_token(_logits(step, want_eos), GREEDY, ctx, policy)
        if token == CODEC_EOS:
            return frames
        frames.append(token)
    raise AssertionError("chunk never ended")


def test_mid_turn_forwards_exactly_25_frames_then_forced_eos() -> None:
    """Edge case 5: EOS is masked for 25 samples even when the model wants it, and the 26th
    sample is EOS even when the model does not want it."""
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.MID_TURN, set(range(1000)))) == 25
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.MID_TURN, set())) == 25


def test_turn_start_allows_early_eos() -> None:
    """Edge case 5: a 24-frame turn-start chunk (model EOS at step 24) ends there."""
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_START, {24})) == 24
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_START, {0})) == 0
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_START, set())) == 25


def test_turn_end_runs_to_103_frames() -> None:
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_END, set())) == 103


def test_turn_end_masks_eos_for_5_steps_after_each_boundary() -> None:
    """The cadence EOS the model emits at every 25-frame boundary must not cut the turn."""
    cadence = {25, 26, 27, 28, 29, 50, 51, 75, 100, 101, 102}
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_END, cadence)) == 103
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_END, {25, 30})) == 30
    assert len(_run_chunk(TalkerChunkPolicy(), ChunkKind.TURN_END, {3})) == 3


def test_turn_end_mask_table() -> None:
    budget = CHUNK_BUDGETS[ChunkKind.TURN_END]
    masked = {s for s in range(budget.max_samples) if budget.is_eos_masked(s)}
    expected = {b + k for b in (25, 50, 75, 100) for k in range(5) if b + k < 104}
    assert masked == expected
    assert [s for s in range(200) if budget.is_eos_forced(s)][0] == 103


def test_empty_chunk_is_eos_at_once() -> None:
    assert _run_chunk(TalkerChunkPolicy(), ChunkKind.EMPTY, set()) == []


def test_sampling_outside_a_chunk_is_eos() -> None:
    """A sample after the chunk's EOS and before the next condition must not forward audio."""
    policy = TalkerChunkPolicy()
    ctx = SampleContext("r", 0, [])
    assert policy.before_sample(torch.zeros(VOCAB), ctx) == CODEC_EOS
    _run_chunk(policy, ChunkKind.MID_TURN, set())
    assert policy.is_chunk_done
    assert policy.before_sample(torch.zeros(VOCAB), ctx) == CODEC_EOS


def test_frequency_penalty_formula() -> None:
    logits = torch.tensor([2.0, -2.0, 3.0, -1.0, 0.5])
    apply_frequency_penalty(logits, [0, 0, 1, 1, 1, 4], penalty=1.5)
    expected = torch.tensor([2.0 / 1.5**2, -2.0 * 1.5**3, 3.0, -1.0, 0.5 / 1.5])
    torch.testing.assert_close(logits, expected)


def test_penalty_window_is_16_and_survives_chunk_boundaries() -> None:
    policy = TalkerChunkPolicy(TalkerSamplingConfig(repetition_penalty=2.0))
    frames = _run_chunk(policy, ChunkKind.MID_TURN, set())
    policy.begin_chunk(ChunkKind.TURN_START)  # history is kept; EOS not masked here
    assert policy.recent_codes == frames[-16:]
    logits = torch.ones(VOCAB)
    ctx = SampleContext("r", 0, [])
    policy.before_sample(logits, ctx)
    penalised = {int(i) for i in torch.nonzero(logits < 1.0)}
    assert penalised == set(frames[-16:])
    assert CODEC_EOS not in policy.recent_codes  # EOS is never forwarded, never counted


def test_sampling_config_defaults_and_neutral_runner_penalty() -> None:
    config = TalkerSamplingConfig()
    params = config.to_sampling_params()
    assert (params.temperature, params.top_p, params.top_k) == (0.8, 0.85, 25)
    assert params.repetition_penalty == 1.0  # the hook applies the 1.05 frequency penalty
    assert (config.repetition_penalty, config.penalty_window, config.seed) == (1.05, 16, 42)


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="repetition_penalty"):
        TalkerSamplingConfig(repetition_penalty=0.0)
