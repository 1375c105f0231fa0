"""The voice prompt: prompt speech codes, prompt mel and speaker embedding of a reference voice.

The reference (docs/model_facts.md#code2wav-token2wav) gets the codes from the S3 tokenizer and
the speaker from campplus, two ONNX models that cannot run here. Their stand-ins are deterministic
functions of the reference audio, documented as such:
- codes: the 16 kHz Whisper log-mel averaged to 25 Hz, centred per utterance, hashed by 13
  seeded random hyperplanes into a 13-bit number taken modulo the 6561 codes;
- speaker: a seeded random projection of the per-bin mean and standard deviation of that
  log-mel (the flow only uses its direction).
An assets folder may instead carry `voice.pt` ({"speech_tokens": [P_tok] int, "spk_embedding":
[192] float}) computed offline by the real tokenizer and campplus for the default voice; then
those are used. The prompt mel follows the reference recipe exactly (`prompt_mel`).

Every prompt is cut or zero-padded to `prompt_seconds` (6 s: 150 codes, 300 mel frames), so all
streams share one cache origin (docs/model_facts.md#code2wav-token2wav).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from backends.models.token2wav.prompt_mel import HOP, SAMPLE_RATE, PromptMel
from backends.models.token2wav.resample import resample
from backends.models.whisper_mel import WhisperMel

VOICE_FILE = "voice.pt"
CODE_RATE = 25  # speech codes per second
_TOKENIZER_RATE = 16000
_WHISPER_FRAMES_PER_CODE = 4  # 100 Hz Whisper frames per 25 Hz code
_HASH_BITS = 13  # 2^13 = 8192 >= 6561 codes
_STANDIN_SEED = 20240607  # fixed: the stand-ins are part of the model, not of a run


@dataclass(frozen=True, slots=True)
class VoicePrompt:
    codes: torch.Tensor  # [P_tok] int64 prompt speech codes
    mel: torch.Tensor  # [2 P_tok, 80] float32 prompt mel
    speaker: torch.Tensor  # [spk_embed_dim] float32 speaker embedding

    @property
    def num_mel_frames(self) -> int:
        return self.mel.shape[0]


def build_voice_prompt(audio: torch.Tensor, sample_rate: int, seconds: float, vocab_size: int,
                       spk_embed_dim: int, override: Path | None = None) -> VoicePrompt:
    """audio: [L] float32 mono in [-1, 1] at `sample_rate` -> the prompt of that voice.

    `override`: a `voice.pt` whose codes and speaker replace the stand-ins (if it exists)."""
    num_codes = round(seconds * CODE_RATE)
    if num_codes < 1 or audio.ndim != 1:
        raise ValueError(f"need a 1-D clip and a positive prompt length, got {tuple(audio.shape)}, "
                         f"{seconds} s")
    audio = audio.float()
    audio_16k = _fit(resample(audio, sample_rate, _TOKENIZER_RATE), num_codes * 640)
    audio_24k = _fit(resample(audio, sample_rate, SAMPLE_RATE), num_codes * 2 * HOP)
    features = _code_rate_features(audio_16k)  # [num_codes, 80]
    codes = _standin_codes(features, vocab_size)
    speaker = _standin_speaker(features, spk_embed_dim)
    if override is not None and Path(override).is_file():
        codes, speaker = _read_override(Path(override), num_codes, spk_embed_dim)
    return VoicePrompt(codes=codes, mel=PromptMel()(audio_24k), speaker=speaker)


def _fit(audio: torch.Tensor, length: int) -> torch.Tensor:
    """Cut to `length` samples or zero-pad at the end."""
    return torch.nn.functional.pad(audio[:length], (0, max(0, length - audio.shape[0])))


def _code_rate_features(audio_16k: torch.Tensor) -> torch.Tensor:
    """-> [num_codes, 80] float32: Whisper log-mel averaged over each code's 4 frames."""
    mel = WhisperMel().spectrogram(audio_16k)  # [80, 4 num_codes]
    return mel.T.reshape(-1, _WHISPER_FRAMES_PER_CODE, mel.shape[0]).mean(dim=1)


def _standin_codes(features: torch.Tensor, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_STANDIN_SEED)
    planes = torch.randn(features.shape[1], _HASH_BITS, generator=generator)
    bits = ((features - features.mean(dim=0)) @ planes > 0).long()  # [num_codes, 13]
    value = (bits * (2 ** torch.arange(_HASH_BITS))).sum(dim=1)
    return value % vocab_size


def _standin_speaker(features: torch.Tensor, spk_embed_dim: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_STANDIN_SEED + 1)
    stats = torch.cat([features.mean(dim=0), features.std(dim=0)])
    projection = torch.randn(spk_embed_dim, stats.shape[0], generator=generator)
    return projection @ stats


def _read_override(path: Path, num_codes: int, spk_embed_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    codes = torch.as_tensor(data["speech_tokens"]).long().reshape(-1)
    speaker = torch.as_tensor(data["spk_embedding"]).float().reshape(-1)
    if speaker.shape[0] != spk_embed_dim:
        raise ValueError(f"{path}: spk_embedding has {speaker.shape[0]} values, need {spk_embed_dim}")
    # the same length rule as the audio: cut, or pad with the silence of the last code
    codes = torch.cat([codes[:num_codes], codes[-1:].expand(max(0, num_codes - codes.shape[0]))])
    return codes, speaker
