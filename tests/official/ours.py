"""Our side of each official reference output (tests/official/build_official.py), computed
from the same checkpoint and the inputs the reference file carries. One function per
reference, named as the builder's `ref_<name>`; each returns what the test compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from backends.audio.streaming_encoder import StreamingAudioEncoder
from backends.checkpoint import Checkpoint, load_checkpoint
from backends.models.talker import TalkerConfig, TalkerModel, load_talker_weights
from backends.runner.model_runner import ModelRunner
from backends.runner.types import RunnerConfig, SamplingParams, StepInput
from backends.thinker.model import ThinkerModel



def _runner(model: torch.nn.Module, dtype: torch.dtype) -> ModelRunner:
    config = RunnerConfig(num_blocks=16, max_num_reqs=1, max_model_len=64, block_size=4,
                          dtype=dtype)
    runner = ModelRunner(model, config)
    runner.add_request("r", SamplingParams())
    return runner


@dataclass(frozen=True, slots=True)
class Ours:
    """Our models loaded from one official checkpoint, in the dtype they run in."""

    checkpoint: Checkpoint
    thinker: ThinkerModel
    talker: TalkerModel
    dtype: torch.dtype

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype) -> Ours:
        ckpt = load_checkpoint(path)
        thinker = ThinkerModel.from_checkpoint(ckpt, "cpu", dtype)
        talker = TalkerModel(TalkerConfig.from_dict(ckpt.config.raw["tts_config"]))
        load_talker_weights(talker, ckpt.weights("tts."))
        return cls(ckpt, thinker, talker.to(dtype).eval(), dtype)


def thinker_logits(ours: Ours, input_ids: np.ndarray, last: int) -> np.ndarray:
    """[n] ids -> the logits of the last `last` rows ([last, vocab] float32)."""
    runner = _runner(ours.thinker.llm, ours.dtype)
    with torch.no_grad():
        out = runner.step([StepInput("r", input_ids.tolist(), None, sample=False,
                                     capture_hidden=True)])[0]
        return ours.thinker.llm.compute_logits(out.hidden[-last:].to(ours.dtype)).float().numpy()


def streaming_audio_rows(ours: Ours, audio: np.ndarray) -> np.ndarray:
    """[k * 16000] float32 -> [k, 10, llm_hidden] float32, one unit at a time."""
    encoder = StreamingAudioEncoder(ours.thinker.audio_encoder)
    units = audio.reshape(-1, encoder.unit_samples)
    with torch.no_grad():
        return np.stack([encoder.encode_unit(unit).float().numpy() for unit in units])


def reference_voice_rows(ours: Ours, clip: np.ndarray) -> np.ndarray:
    encoder = StreamingAudioEncoder(ours.thinker.audio_encoder)
    return encoder.encode_reference(clip).float().numpy()


def talker_greedy(ours: Ours, ids: np.ndarray, hidden: np.ndarray,
                  steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The duplex condition of (ids, hidden), then `steps` greedy codes with EOS barred (the
    builder's `force_no_stop`) -> (condition, logits [steps, codes], codes [steps - 1]); the
    last drawn code is dropped, as the official `generate_chunk` returns."""
    talker = ours.talker
    eos = talker.config.eos_id
    runner = _runner(talker, ours.dtype)
    logits, codes = [], []
    with torch.no_grad():
        condition = talker.condition_embeds(torch.from_numpy(ids), torch.from_numpy(hidden))
        step = StepInput("r", [0] * condition.shape[0], condition, sample=False, capture_hidden=True)
        for _ in range(steps):
            hidden_row = runner.step([step])[0].hidden[-1:].to(ours.dtype)
            row = talker.compute_logits(hidden_row).float()[0]
            row[eos] = -torch.inf
            logits.append(row.numpy())
            codes.append(int(row.argmax()))
            step = StepInput("r", [codes[-1]], None, sample=False, capture_hidden=True)
    return condition.float().numpy(), np.stack(logits), np.array(codes[:-1])
