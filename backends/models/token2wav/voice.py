"""The voice prompt: prompt speech codes, prompt mel and speaker embedding of a reference voice.

The reference (docs/model_facts.md#code2wav-token2wav) takes a clip, resamples it to 16 kHz for
the S3 speech tokenizer (codes) and campplus (speaker), and to 24 kHz for the prompt mel
(`prompt_mel`). The codes and the speaker come from a `VoiceEncoder`: the real ONNX models
(`voice_onnx`) when the checkpoint has them, else documented stand-ins (`voice_standin`);
`voice_assets` picks one at load.

One difference from the reference, on purpose: every prompt is exactly `prompt_seconds` long
(6 s: 150 codes, 300 mel frames), so all streams share one cache origin. The reference keeps the
whole clip (a 6.016 s clip gives it 151 codes and 302 mel frames). Here the clip is zero-padded
at the end to at least 6 s, the codes and the mel are computed over the whole clip as the
reference computes them, and the first 150 codes and 300 frames are kept: for a clip of 6 s or
more they are exactly the reference's first 150 codes and 300 frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from backends.models.token2wav.prompt_mel import HOP, SAMPLE_RATE, PromptMel
from backends.models.token2wav.resample import resample

CODE_RATE = 25  # speech codes per second
TOKENIZER_RATE = 16000  # the S3 tokenizer's and campplus' sample rate
SAMPLES_PER_CODE = TOKENIZER_RATE // CODE_RATE  # 640
MEL_FRAMES_PER_CODE = 2


@dataclass(frozen=True, slots=True)
class VoicePrompt:
    codes: torch.Tensor  # [P_tok] int64 prompt speech codes
    mel: torch.Tensor  # [2 P_tok, 80] float32 prompt mel
    speaker: torch.Tensor  # [spk_embed_dim] float32 speaker embedding

    @property
    def num_mel_frames(self) -> int:
        return self.mel.shape[0]


class VoiceEncoder(Protocol):
    """Prompt codes and speaker embedding of a clip."""

    description: str  # what computes them, for logs

    def encode(self, audio_16k: torch.Tensor, num_codes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """audio_16k: [L] float32 mono at 16 kHz, the whole clip ->
        ([num_codes] int64 codes, [spk_embed_dim] float32 speaker)."""
        ...


def build_voice_prompt(audio: torch.Tensor, sample_rate: int, seconds: float,
                       encoder: VoiceEncoder) -> VoicePrompt:
    """audio: [L] float32 mono in [-1, 1] at `sample_rate` -> the prompt of that voice."""
    num_codes = round(seconds * CODE_RATE)
    if num_codes < 1 or audio.ndim != 1:
        raise ValueError(f"need a 1-D clip and a positive prompt length, got {tuple(audio.shape)}, "
                         f"{seconds} s")
    audio = audio.float()
    codes, speaker = encoder.encode(resample(audio, sample_rate, TOKENIZER_RATE), num_codes)
    num_frames = MEL_FRAMES_PER_CODE * num_codes
    audio_24k = pad_to_at_least(resample(audio, sample_rate, SAMPLE_RATE), num_frames * HOP)
    return VoicePrompt(codes=codes, mel=PromptMel()(audio_24k)[:num_frames], speaker=speaker)


def pad_to_at_least(audio: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad at the end up to `length` samples; a longer clip is kept whole."""
    return torch.nn.functional.pad(audio, (0, max(0, length - audio.shape[0])))


def fit(audio: torch.Tensor, length: int) -> torch.Tensor:
    """Cut to `length` samples or zero-pad at the end."""
    return pad_to_at_least(audio[:length], length)
