"""Checkpoint directories in the MiniCPM-o 4.5 layout: config, tokenizer, weights, assets.

`load_checkpoint` reads a real or a tiny checkpoint; `ensure_tiny_checkpoint` generates the
tiny default one (real key layout, tiny widths, seeded random weights); `prepare.py` resolves a
profile's `checkpoint` variable (tiny, full-random or a directory) to what the stages load.
"""

from backends.checkpoint.config import AudioConfig, LlmConfig, MiniCPMOConfig, TtsConfig
from backends.checkpoint.loader import Checkpoint, CheckpointError, load_checkpoint
from backends.checkpoint.tiny import ensure_tiny_checkpoint
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer

__all__ = [
    "AudioConfig", "Checkpoint", "CheckpointError", "LlmConfig", "MiniCPMOConfig",
    "SpecialTokens", "TextTokenizer", "TtsConfig", "ensure_tiny_checkpoint", "load_checkpoint",
]
