"""Audio as the WebSocket protocols carry it (base64 of little-endian float32 PCM) and as the
duplex contract carries it (int16 PCM): 16 kHz in, 24 kHz out, mono both ways."""
from __future__ import annotations

import base64
import binascii

import numpy as np

INPUT_SAMPLE_RATE = 16000
OUTPUT_SAMPLE_RATE = 24000
OUTPUT_FORMAT = {"encoding": "pcm_f32le", "sample_rate": OUTPUT_SAMPLE_RATE, "channels": 1}


class AudioDecodeError(ValueError):
    """The client's audio is not base64 of float32 samples."""


def float32_base64_to_pcm16(text: object) -> np.ndarray:
    """Base64 float32 samples in [-1, 1] (clipped) -> int16 PCM."""
    if not isinstance(text, str):
        raise AudioDecodeError("audio must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise AudioDecodeError(f"audio is not valid base64: {err}") from None
    if len(raw) % 4:
        raise AudioDecodeError(f"audio is {len(raw)} bytes, not a whole number of float32 samples")
    samples = np.frombuffer(raw, dtype="<f4")
    if not np.isfinite(samples).all():
        raise AudioDecodeError("audio holds NaN or infinite samples")
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def pcm16_to_float32_base64(pcm: np.ndarray) -> str:
    """int16 PCM -> base64 of float32 samples in [-1, 1)."""
    samples = (np.asarray(pcm, dtype=np.int16).astype("<f4") / 32768.0)
    return base64.b64encode(samples.tobytes()).decode("ascii")
