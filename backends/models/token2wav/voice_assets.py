"""Which voice encoder a token2wav assets folder gets: the real ONNX models or the stand-ins.

Both `campplus.onnx` and `speech_tokenizer_v2_25hz.onnx` present: the real encoder
(`voice_onnx`), for the default voice and every session's reference alike. Neither: the
stand-ins (`voice_standin`, random-weight checkpoints), said once in the log at load. Only one
of the two: an error at load naming the missing file, since half a real voice path would give
a voice that is neither the official one nor a documented stand-in.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from backends.models.token2wav.voice import VoiceEncoder
from backends.models.token2wav.voice_standin import StandinVoiceEncoder

CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2_25hz.onnx"
VOICE_MODEL_FILES = (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE)

_LOG = logging.getLogger(__name__)


class VoiceAssetsError(FileNotFoundError):
    """The assets folder has one of the two voice models but not the other."""


def load_voice_encoder(assets_dir: Path, device: torch.device | str, vocab_size: int,
                       spk_embed_dim: int) -> VoiceEncoder:
    assets_dir, device = Path(assets_dir), torch.device(device)
    present = [name for name in VOICE_MODEL_FILES if (assets_dir / name).is_file()]
    if not present:
        return standin_voice_encoder(vocab_size, spk_embed_dim,
                                     f"{assets_dir} has neither {CAMPPLUS_FILE} nor {SPEECH_TOKENIZER_FILE}")
    if len(present) < len(VOICE_MODEL_FILES):
        missing = next(name for name in VOICE_MODEL_FILES if name not in present)
        raise VoiceAssetsError(f"{assets_dir}: missing {missing} (the voice prompt needs it beside "
                               f"{present[0]})")
    from backends.models.token2wav.voice_onnx import OnnxVoiceEncoder, open_session

    encoder = OnnxVoiceEncoder(tokenizer=open_session(assets_dir / SPEECH_TOKENIZER_FILE, device),
                               campplus=open_session(assets_dir / CAMPPLUS_FILE, device),
                               vocab_size=vocab_size, spk_embed_dim=spk_embed_dim)
    _LOG.info("voice prompt: %s, providers %s", encoder.description, encoder.tokenizer.get_providers())
    return encoder


def standin_voice_encoder(vocab_size: int, spk_embed_dim: int, reason: str) -> VoiceEncoder:
    """The stand-ins, with the one log line that says so and why."""
    encoder = StandinVoiceEncoder(vocab_size, spk_embed_dim)
    _LOG.warning("voice prompt: %s, because %s; voices differ from the official model's",
                 encoder.description, reason)
    return encoder
