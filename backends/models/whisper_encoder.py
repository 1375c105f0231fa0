"""Whisper encoder with MiniCPM-o's streaming path; the Thinker's `apm.*` weights.

Parameter names equal transformers' WhisperEncoder (`conv1.weight`, `embed_positions.weight`,
`layers.N.self_attn.k_proj.weight` (no bias), `layers.N.fc1.*`, `layer_norm.*`, ...), so its
state dict loads as is. Two paths over the same weights:
- `forward(mel)`: a whole clip, full attention (equal to transformers on its 3000-frame input,
  and usable on any shorter one), or block-causal in chunks of `chunk_frames` encoder frames,
  the mask MiniCPM-o uses for non-streaming audio.
- `forward_chunk(mel_chunk, cache)`: one streaming chunk of one session. The chunk attends to
  itself fully and to the session's earlier frames through `EncoderKVCache`; positions continue
  from the cache. The chunk's mel carries redundancy frames on each side so the conv stack sees
  real context; (extra + 1) // 2 conv frames are cropped from each side after the stride-2
  conv, before positions are added. When cache length + the chunk's conv frames (before the
  crop) reaches `max_source_positions`, the cache is emptied first and the chunk starts again at
  position 0, as the reference does (the 30th 1 s chunk with the real table of 1500).
Streaming chunks therefore reproduce `forward(mel, chunk_frames=...)` over the concatenated mel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from backends.models.encoder_kv import ChunkKV, EncoderKVCache, KeyEnds

_CONV_STRIDE = 2  # conv2 halves the mel frame rate (100 Hz -> 50 Hz)
# cuDNN attention builds an execution plan per new shape (tens of ms on the CPU), and a
# streaming cache offers a new key length every chunk: keep to the shape-agnostic kernels.
_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_SINUSOID_MAX_TIMESCALE = 10000.0


@dataclass(frozen=True, slots=True)
class WhisperEncoderConfig:
    d_model: int = 1024
    encoder_layers: int = 24
    encoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    num_mel_bins: int = 80
    max_source_positions: int = 1500  # 30 s of 50 Hz encoder frames

    def __post_init__(self) -> None:
        for name in ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                     "num_mel_bins", "max_source_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.encoder_attention_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by encoder_attention_heads "
                f"({self.encoder_attention_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @classmethod
    def from_dict(cls, audio_config: Mapping[str, Any]) -> WhisperEncoderConfig:
        """From an HF `audio_config` section; keys this encoder does not use are ignored."""
        names = cls.__dataclass_fields__
        return cls(**{k: int(v) for k, v in audio_config.items() if k in names})


def whisper_sinusoids(length: int, channels: int) -> torch.Tensor:
    """Whisper's sinusoidal position table (sines then cosines): [length, channels] float32."""
    if channels % 2:
        raise ValueError(f"sinusoid channels must be even, got {channels}")
    increment = math.log(_SINUSOID_MAX_TIMESCALE) / (channels // 2 - 1)
    inverse_timescales = torch.exp(-increment * torch.arange(channels // 2))
    angles = torch.arange(length)[:, None] * inverse_timescales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def block_causal_mask(num_frames: int, chunk_frames: int, device: torch.device) -> torch.Tensor:
    """[num_frames, num_frames] bool, True where a frame may attend: its own chunk and earlier."""
    index = torch.arange(num_frames, device=device)
    chunk_end = (index // chunk_frames + 1) * chunk_frames
    return index[None, :] < chunk_end[:, None]


class WhisperAttention(nn.Module):
    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.encoder_attention_heads
        # declared in transformers' order, so state dicts list keys identically
        # Whisper's key projection has no bias
        self.k_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self._packed: tuple[torch.Tensor, torch.Tensor, tuple[int, ...]] | None = None

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | KeyEnds | None,
                cache: ChunkKV | None, layer: int) -> torch.Tensor:
        # hidden [batch, n, d_model]; mask bool, broadcast to [batch, heads, n, keys], or
        # KeyEnds, or None; an EncoderKVCache only with batch 1
        q, k, v = (self._heads(x) for x in self._project(hidden))
        if cache is not None:
            k, v = cache.append(layer, k, v)
        if isinstance(mask, KeyEnds):  # the graphed pass, keys split over programs
            from backends.models.chunk_attention_kernel import chunk_attention  # imports Triton

            return self.out_proj(chunk_attention(q, k, v, mask.ends))
        with sdpa_kernel(_ATTENTION_BACKENDS):
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(attended.transpose(1, 2).flatten(2))

    def pack_projections(self, packed: bool = True) -> None:
        """q, k, v by one GEMM over a [3 d, d] weight the three parameters view (k's bias: zeros).
        Loads copy into the views; a `.to()` that moves them makes `_project` use three GEMMs
        again, as does packed False."""
        if not packed:
            self._packed = None
            return
        if self._packed is not None and self._packed[2] == self._view_pointers():
            return  # packed already: captured graphs may read these tensors
        projections, size = (self.q_proj, self.k_proj, self.v_proj), self.q_proj.out_features
        with torch.inference_mode(False), torch.no_grad():  # tensors any later mode may use
            weight = torch.cat([proj.weight for proj in projections])
            bias = torch.cat([self.q_proj.bias, torch.zeros_like(self.q_proj.bias),
                              self.v_proj.bias])
        for index, proj in enumerate(projections):
            proj.weight.data = weight[index * size:(index + 1) * size]
        self.q_proj.bias.data, self.v_proj.bias.data = bias[:size], bias[2 * size:]
        self._packed = (weight, bias, self._view_pointers())

    def _view_pointers(self) -> tuple[int, ...]:
        return tuple(tensor.data_ptr() for tensor in (
            self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.q_proj.bias,
            self.v_proj.bias))

    def _project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # [batch, n, d_model] -> q, k, v, each [batch, n, d_model]
        if self._packed is not None and self._packed[2] == self._view_pointers():
            return F.linear(hidden, self._packed[0], self._packed[1]).chunk(3, dim=-1)
        return self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [batch, n, d_model] -> [batch, heads, n, head_dim]
        return x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)


class WhisperEncoderLayer(nn.Module):
    """Pre-LN block: x + attn(LN(x)), then x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.self_attn = WhisperAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | KeyEnds | None,
                cache: ChunkKV | None, layer: int) -> torch.Tensor:
        # hidden [batch, n, d_model] -> same
        hidden = hidden + self.self_attn(self.self_attn_layer_norm(hidden), mask, cache, layer)
        return hidden + self.fc2(F.gelu(self.fc1(self.final_layer_norm(hidden))))


class WhisperEncoder(nn.Module):
    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv1d(config.num_mel_bins, config.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(config.d_model, config.d_model, kernel_size=3,
                               stride=_CONV_STRIDE, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, config.d_model)
        self.embed_positions.requires_grad_(False)
        with torch.no_grad():
            self.embed_positions.weight.copy_(
                whisper_sinusoids(config.max_source_positions, config.d_model))
        self.layers = nn.ModuleList(
            WhisperEncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, mel: torch.Tensor, chunk_frames: int | None = None) -> torch.Tensor:
        """Encode whole clips: mel [batch, num_mel_bins, num_mel_frames] ->
        [batch, (num_mel_frames - 1) // 2 + 1, d_model] in the model dtype."""
        if mel.ndim != 3:
            raise ValueError(f"mel must be [batch, num_mel_bins, frames], got {tuple(mel.shape)}")
        hidden = self.conv_frames(mel)
        num = hidden.shape[1]
        if num > self.config.max_source_positions:
            raise ValueError(
                f"{mel.shape[-1]} mel frames give {num} encoder frames, more than "
                f"max_source_positions {self.config.max_source_positions}"
            )
        if chunk_frames is not None and chunk_frames <= 0:
            raise ValueError(f"chunk_frames must be positive, got {chunk_frames}")
        mask = None if chunk_frames is None else block_causal_mask(num, chunk_frames, mel.device)
        return self.transform(hidden + self.embed_positions.weight[:num], mask, None)

    def forward_chunk(
        self, mel_chunk: torch.Tensor, cache: EncoderKVCache | None, *,
        prefix_extra_frames: int = 0, suffix_extra_frames: int = 0,
    ) -> tuple[torch.Tensor, EncoderKVCache]:
        """Encode one streaming chunk of one session.

        mel_chunk [num_mel_bins, frames] holds `prefix_extra_frames` + core + `suffix_extra_frames`
        mel frames. Returns the core's encoder frames [core_frames // 2, d_model] and the cache,
        updated in place (allocated here when None is passed).
        """
        if mel_chunk.ndim != 2:
            raise ValueError(
                f"mel_chunk must be [num_mel_bins, frames], got {tuple(mel_chunk.shape)}")
        if prefix_extra_frames < 0 or suffix_extra_frames < 0:
            raise ValueError(
                f"extra frames must be >= 0, got prefix {prefix_extra_frames}, "
                f"suffix {suffix_extra_frames}"
            )
        conv = self.conv_frames(mel_chunk[None])
        hidden = crop_redundancy(conv, prefix_extra_frames, suffix_extra_frames)
        cache = self.cache_for(cache, conv.shape[1])
        start, end = cache.length, cache.length + hidden.shape[1]
        out = self.transform(hidden + self.embed_positions.weight[start:end], None, cache)
        cache.length = end
        return out[0], cache

    def cache_for(self, cache: EncoderKVCache | None, conv_frames: int) -> EncoderKVCache:
        """The cache a chunk of `conv_frames` (uncropped) writes to: allocated, or emptied when
        the chunk would reach the position table."""
        limit = self.config.max_source_positions
        if conv_frames > limit:
            raise ValueError(
                f"a chunk of {conv_frames} encoder frames exceeds the table of {limit}")
        if cache is None:
            weight = self.conv1.weight
            return EncoderKVCache.allocate(self.config, weight.dtype, weight.device)
        if cache.length + conv_frames >= limit:
            cache.length = 0  # the reference resets on the uncropped count, so do we
        return cache

    def conv_frames(self, mel: torch.Tensor) -> torch.Tensor:
        # [batch, num_mel_bins, frames] -> [batch, (frames - 1) // 2 + 1, d_model]
        if mel.shape[1] != self.config.num_mel_bins:
            raise ValueError(f"expected {self.config.num_mel_bins} mel bins, got {mel.shape[1]}")
        mel = mel.to(self.conv1.weight.dtype)
        hidden = F.gelu(self.conv2(F.gelu(self.conv1(mel))))
        return hidden.transpose(1, 2)

    def pack_projections(self, packed: bool = True) -> None:
        """Every layer's q, k, v as one GEMM (`WhisperAttention.pack_projections`); call after
        the tower's last move to its device and dtype."""
        for layer in self.layers:
            layer.self_attn.pack_projections(packed)

    def transform(self, hidden: torch.Tensor, mask: torch.Tensor | KeyEnds | None,
                  cache: ChunkKV | None) -> torch.Tensor:
        # hidden [batch, n, d_model] with positions added -> final-LN output, same shape
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, mask, cache, index)
        return self.layer_norm(hidden)


def crop_redundancy(hidden: torch.Tensor, prefix_extra_frames: int,
                    suffix_extra_frames: int) -> torch.Tensor:
    """Drop the conv frames of a chunk's mel redundancy, (extra + 1) // 2 per side:
    [batch, n, d_model] -> [batch, n - front - back, d_model]."""
    front, back = (prefix_extra_frames + 1) // 2, (suffix_extra_frames + 1) // 2
    kept = hidden.shape[1] - front - back
    if kept <= 0:
        raise ValueError(
            f"cropping {front} + {back} redundancy frames leaves no frame of {hidden.shape[1]}"
        )
    return hidden[:, front:front + kept]
