"""The Talker's duplex sampling policy: per-condition chunk budgets and the codec penalty.

Each Thinker unit appends one condition to the Talker request and the Talker then samples one
chunk of codec frames ending in EOS. The budget depends on where the unit sits in the turn
(docs/model_facts.md#talker-chunks): a mid-turn chunk is exactly 25 frames + a forced EOS; a
turn-start chunk may stop early; a turn-end chunk may run to 103 frames but its EOS is masked for
5 steps after every 25-frame boundary, because the model emits a cadence EOS every 25 frames that
must not cut the tail of the turn. The last sample of every budget is a forced EOS, so a chunk
never forwards more than max_samples - 1 frames.

The repetition penalty is upstream's windowed frequency penalty (logit scaled by
penalty^count over the last 16 sampled codes), not the runner's HF penalty, so the runner's
own penalty is neutralised in `TalkerSamplingConfig.to_sampling_params`. Its history lives in
the hook and so survives condition boundaries and Talker rollovers.

This class is the reference and the host hook (CPU reference runner, custom policies). Where
the runner samples on the device, the same policy runs as `backends.talker.policy_table`
(per-slot device tables applied inside the sampling step), tested token for token against it.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import torch

from backends.runner.types import SampleContext, SamplingParams

CODEC_EOS = 6561  # num_audio_tokens - 1
CHUNK_FRAMES = 25  # codec frames per 1 s unit at 25 Hz


class ChunkKind(enum.Enum):
    MID_TURN = "mid_turn"
    TURN_START = "turn_start"
    TURN_END = "turn_end"
    EMPTY = "empty"  # empty handoff: conditioned on the boundary rows only, EOS at once


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    max_samples: int  # the last one is a forced EOS
    min_samples: int  # EOS masked while fewer samples than this - 1 were drawn
    mask_eos_after_boundaries: bool = False  # turn end: EOS masked for `boundary_mask_steps`
    boundary_mask_steps: int = 5  # after every CHUNK_FRAMES boundary

    def __post_init__(self) -> None:
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {self.max_samples}")
        if not 0 <= self.min_samples <= self.max_samples:
            raise ValueError(
                f"min_samples must be in [0, {self.max_samples}], got {self.min_samples}"
            )

    def is_eos_masked(self, step: int) -> bool:
        """step: 0-based index of the sample about to be drawn in this chunk."""
        if step < self.min_samples - 1:
            return True
        return (
            self.mask_eos_after_boundaries
            and step >= CHUNK_FRAMES
            and step % CHUNK_FRAMES < self.boundary_mask_steps
        )

    def is_eos_forced(self, step: int) -> bool:
        return step >= self.max_samples - 1


CHUNK_BUDGETS: dict[ChunkKind, ChunkBudget] = {
    ChunkKind.MID_TURN: ChunkBudget(max_samples=CHUNK_FRAMES + 1, min_samples=CHUNK_FRAMES + 1),
    ChunkKind.TURN_START: ChunkBudget(max_samples=CHUNK_FRAMES + 1, min_samples=0),
    ChunkKind.TURN_END: ChunkBudget(
        max_samples=4 * (CHUNK_FRAMES + 1), min_samples=0, mask_eos_after_boundaries=True
    ),
    ChunkKind.EMPTY: ChunkBudget(max_samples=1, min_samples=0),
}


@dataclass(frozen=True, slots=True)
class TalkerSamplingConfig:
    """Stage-1 sampling (deploy YAML, mirrors upstream TTSSamplingParams)."""

    temperature: float = 0.8
    top_p: float = 0.85
    top_k: int = 25
    repetition_penalty: float = 1.05  # windowed frequency penalty, applied by the hook
    penalty_window: int = 16  # last sampled codes the penalty counts
    seed: int = 42

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.penalty_window < 0:
            raise ValueError(f"penalty_window must be >= 0, got {self.penalty_window}")

    def to_sampling_params(self) -> SamplingParams:
        """Runner params with its own penalty off: the hook applies the frequency penalty."""
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed
        )


def apply_frequency_penalty(logits: torch.Tensor, recent: list[int], penalty: float) -> None:
    """In place on logits [vocab] float32: each code's logit is multiplied by penalty^count
    if negative, divided by penalty^count if positive (count = occurrences in `recent`)."""
    if penalty == 1.0 or not recent:
        return
    ids = torch.tensor(recent, dtype=torch.int64, device=logits.device)
    counts = torch.bincount(ids, minlength=logits.shape[0])[: logits.shape[0]]
    scale = torch.pow(torch.tensor(penalty, dtype=logits.dtype, device=logits.device), counts)
    logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))


class TalkerChunkPolicy:
    """A runner `SamplingHook` for one Talker request (one per request; not shared).

    The Talker stage calls `begin_chunk` each time it appends a condition; the runner calls
    `before_sample` / `after_sample` for every token sampled after it.
    """

    def __init__(self, sampling: TalkerSamplingConfig | None = None, eos_id: int = CODEC_EOS):
        self.sampling = sampling or TalkerSamplingConfig()
        self.eos_id = eos_id
        self._history: deque[int] = deque(maxlen=self.sampling.penalty_window or None)
        self._budget = CHUNK_BUDGETS[ChunkKind.EMPTY]
        self._step = 0
        self._is_done = True  # no chunk open until begin_chunk

    @property
    def step(self) -> int:
        """Samples drawn in the current chunk (EOS included)."""
        return self._step

    @property
    def is_chunk_done(self) -> bool:
        return self._is_done

    @property
    def recent_codes(self) -> list[int]:
        return list(self._history)

    def begin_chunk(self, kind: ChunkKind) -> None:
        self._budget = CHUNK_BUDGETS[kind]
        self._step = 0
        self._is_done = False

    def before_sample(self, logits: torch.Tensor, ctx: SampleContext) -> int | None:
        """logits: [num_audio_tokens] float32, modified in place; returns a forced EOS."""
        # A sample outside an open chunk would forward a frame no budget accounts for.
        if self._is_done or self._budget.is_eos_forced(self._step):
            return self.eos_id
        apply_frequency_penalty(logits, list(self._history), self.sampling.repetition_penalty)
        if self._budget.is_eos_masked(self._step):
            logits[self.eos_id] = float("-inf")
        return None

    def after_sample(self, token: int, ctx: SampleContext) -> int:
        self._step += 1
        if token == self.eos_id:
            self._is_done = True
        else:
            self._history.append(token)  # EOS is never forwarded, so it is not counted
        return token
