"""The Thinker's audio tower, shared by every session: Whisper encoder (`apm.*`), projector
(`audio_projection_layer.*`) and the average pool of 5. Holds weights only; per-session state
lives in `StreamingAudioEncoder`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from backends.models.audio_projector import AUDIO_POOL_STEP, AudioAvgPool, MultiModalProjector
from backends.models.whisper_encoder import WhisperEncoder, WhisperEncoderConfig

WEIGHT_PREFIXES = ("apm.", "audio_projection_layer.")  # checkpoint keys this module owns


class AudioEncoderModel(nn.Module):
    def __init__(self, encoder_config: WhisperEncoderConfig, llm_hidden_size: int,
                 pool_step: int = AUDIO_POOL_STEP) -> None:
        super().__init__()
        projector_in = encoder_config.encoder_ffn_dim // 4
        # Upstream sizes the projector from the ffn width; it must still fit the encoder output.
        if projector_in != encoder_config.d_model:
            raise ValueError(
                f"projector input encoder_ffn_dim // 4 = {projector_in} differs from d_model "
                f"{encoder_config.d_model}"
            )
        self.apm = WhisperEncoder(encoder_config)
        self.audio_projection_layer = MultiModalProjector(projector_in, llm_hidden_size)
        self.audio_avg_pooler = AudioAvgPool(pool_step)

    @classmethod
    def from_config(cls, encoder_config: WhisperEncoderConfig, llm_hidden_size: int, *,
                    pool_step: int = AUDIO_POOL_STEP, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> AudioEncoderModel:
        """A randomly initialised tower in eval mode on `device`; load weights afterwards."""
        return cls(encoder_config, llm_hidden_size, pool_step).to(device=device, dtype=dtype).eval()

    @property
    def llm_hidden_size(self) -> int:
        return self.audio_projection_layer.linear2.out_features

    def embed(self, frames: torch.Tensor) -> torch.Tensor:
        """Encoder frames to LLM embeddings:
        [..., n, d_model] -> [..., n // pool_step, llm_hidden]."""
        return self.audio_avg_pooler(self.audio_projection_layer(frames))

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the `apm.*` and `audio_projection_layer.*` entries of a checkpoint-keyed mapping
        (other prefixes are ignored); every parameter must be present and no unknown key may use
        these prefixes. Tensors are cast to this module's dtype and device."""
        own = {k: v for k, v in state_dict.items() if k.startswith(WEIGHT_PREFIXES)}
        expected = set(self.state_dict())
        missing, unexpected = sorted(expected - own.keys()), sorted(own.keys() - expected)
        if missing or unexpected:
            raise ValueError(
                f"audio encoder weights do not match: missing {missing[:8]}"
                f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                f"{' ...' if len(unexpected) > 8 else ''}"
            )
        try:
            self.load_state_dict(own, strict=True)
        except RuntimeError as error:  # shape mismatches
            raise ValueError(f"audio encoder weights do not fit: {error}") from error
