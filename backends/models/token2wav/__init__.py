"""Code2Wav vocoder (Step-Audio2 token2wav): codes -> mel (flow: Conformer encoder + CFM with a
DiT estimator) -> 24 kHz audio (HiFT), streamed in windows for many streams at once."""

from backends.models.token2wav.assets import load_token2wav, write_token2wav_assets
from backends.models.token2wav.config import (
    CFMConfig,
    DiTConfig,
    EncoderConfig,
    FlowConfig,
    HiFTConfig,
    Token2WavConfig,
)
from backends.models.token2wav.stream import Token2WavStream
from backends.models.token2wav.stream_window import StreamWindow
from backends.models.token2wav.token2wav import Token2Wav, Voice
from backends.models.token2wav.voice import VoicePrompt

__all__ = [
    "CFMConfig",
    "DiTConfig",
    "EncoderConfig",
    "FlowConfig",
    "HiFTConfig",
    "StreamWindow",
    "Token2Wav",
    "Token2WavConfig",
    "Token2WavStream",
    "Voice",
    "VoicePrompt",
    "load_token2wav",
    "write_token2wav_assets",
]
