"""Code2Wav vocoder (Step-Audio2 token2wav structure): codes -> mel (flow) -> 24 kHz (HiFT)."""

from backends.models.token2wav.assets import load_token2wav, write_token2wav_assets
from backends.models.token2wav.config import (
    EncoderConfig,
    FlowConfig,
    HiFTConfig,
    Token2WavConfig,
)
from backends.models.token2wav.stream import Token2WavStream
from backends.models.token2wav.token2wav import StreamWindow, Token2Wav

__all__ = [
    "EncoderConfig",
    "FlowConfig",
    "HiFTConfig",
    "StreamWindow",
    "Token2Wav",
    "Token2WavConfig",
    "Token2WavStream",
    "load_token2wav",
    "write_token2wav_assets",
]
