"""Streaming `UpsampleConformerEncoderV2`: code embeddings -> mel-rate features.

Structure and parameter names follow the reference (docs/model_facts.md#code2wav-token2wav):
`embed` (Linear + LayerNorm, x sqrt(d)) -> `pre_lookahead_layer` (conv1 consumes the 3 look-ahead
codes, leaky ReLU 0.01, conv2 is causal with a 2-frame cache) -> token-rate `encoders` ->
`up_layer` (nearest x2 + causal conv with a 4-frame cache) -> `up_embed` -> mel-rate `up_encoders`
-> `after_norm`. A non-final window of N codes yields N - 3 code frames (2 (N - 3) mel frames); a
final window is zero-padded by 3 frames after `embed` and yields all N. With empty caches and one
final window this is the reference's whole-utterance `forward`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.config import EncoderConfig
from backends.models.token2wav.conformer import ConformerEncoderLayer
from backends.models.token2wav.encoder_packing import (
    CONV2_CONTEXT,
    EncoderCache,
    EncoderInputs,
    EncoderOutputs,
    pack_encoder_inputs,
    unpack_encoder_outputs,
)
from backends.models.token2wav.rel_position import RelPositionalEncoding

_EMBED_NORM_EPS = 1e-5
_LOOKAHEAD_SLOPE = 0.01  # F.leaky_relu's default, as in the reference pre-lookahead layer


class LinearNoSubsampling(nn.Module):
    def __init__(self, in_size: int, out_size: int) -> None:
        super().__init__()
        self.out = nn.Sequential(
            nn.Linear(in_size, out_size), nn.LayerNorm(out_size, eps=_EMBED_NORM_EPS)
        )
        self.xscale = math.sqrt(out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.xscale


class PreLookaheadLayer(nn.Module):
    def __init__(self, size: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(size, size, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(size, size, kernel_size=CONV2_CONTEXT + 1)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, M + lookahead, d], cache: [B, d, 2] ->
        (out [B, M, d], conv2 input with its context [B, d, 2 + M])."""
        hidden = F.leaky_relu(self.conv1(x.transpose(1, 2)), _LOOKAHEAD_SLOPE)
        conv2_in = torch.cat([cache, hidden], dim=2)
        out = self.conv2(conv2_in).transpose(1, 2)
        return out + x[:, : x.shape[1] - self.lookahead], conv2_in


class Upsample1D(nn.Module):
    def __init__(self, size: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(size, size, kernel_size=2 * stride + 1)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, M, d], cache: [B, d, 2 stride] ->
        (out [B, stride M, d], conv input with its context [B, d, 2 stride + stride M])."""
        conv_in = torch.cat([cache, x.transpose(1, 2).repeat_interleave(self.stride, 2)], 2)
        return self.conv(conv_in).transpose(1, 2), conv_in


class UpsampleConformerEncoderV2(nn.Module):
    def __init__(self, input_size: int, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        size = config.output_size
        self.embed = LinearNoSubsampling(input_size, size)
        self.position = RelPositionalEncoding(size, config.max_positions)
        self.pre_lookahead_layer = PreLookaheadLayer(size, config.pre_lookahead_len)
        self.encoders = nn.ModuleList(self._layer() for _ in range(config.num_blocks))
        self.up_layer = Upsample1D(size, config.up_stride)
        self.up_embed = LinearNoSubsampling(size, size)
        self.up_encoders = nn.ModuleList(self._layer() for _ in range(config.num_up_blocks))
        self.after_norm = nn.LayerNorm(size, eps=_EMBED_NORM_EPS)

    def _layer(self) -> ConformerEncoderLayer:
        c = self.config
        return ConformerEncoderLayer(c.output_size, c.attention_heads, c.linear_units)

    def set_fused_attention(self, enabled: bool | None) -> None:
        """Every layer's attention form (`RelPositionMultiHeadedAttention.fused`)."""
        for layer in (*self.encoders, *self.up_encoders):
            layer.self_attn.fused = enabled

    def new_cache(self, device: torch.device | str) -> EncoderCache:
        c = self.config
        head_dim = c.output_size // c.attention_heads
        kv = (c.attention_heads, 0, 2 * head_dim)
        like = {"device": device, "dtype": self.after_norm.weight.dtype}
        return EncoderCache(
            lookahead=torch.zeros(c.output_size, CONV2_CONTEXT, **like),
            upsample=torch.zeros(c.output_size, 2 * c.up_stride, **like),
            token_kv=torch.zeros(c.num_blocks, *kv, **like),
            mel_kv=torch.zeros(c.num_up_blocks, *kv, **like),
        )

    def forward_chunk(
        self,
        xs: torch.Tensor,  # [B, N_max, input_size] code embeddings, any value past a row's codes
        num_codes: list[int],  # codes per row
        last_chunk: list[bool],  # a final row also decodes its look-ahead (zero-padded)
        caches: list[EncoderCache],
    ) -> tuple[torch.Tensor, list[int], list[EncoderCache]]:
        """-> (features [B, T_max, d] at mel rate, valid mel frames per row, new caches; the
        attention caches are grown, not pruned)."""
        features, mel_frames, grow = self.launch_chunk(xs, num_codes, last_chunk, caches)
        return features, mel_frames, grow()

    def launch_chunk(
        self, xs: torch.Tensor | np.ndarray, num_codes: list[int], last_chunk: list[bool],
        caches: list[EncoderCache], run: Callable[[EncoderInputs], EncoderOutputs] | None = None,
    ) -> tuple[torch.Tensor, list[int], Callable[[], list[EncoderCache]]]:
        """`forward_chunk` with the cache growth left to the caller (`unpack_encoder_outputs`):
        call the returned `grow` once the work that needs only the features is queued, and
        before this encoder runs again. `run` runs the packed window: `self.run` (default), its
        graph replays (`graphs.EncoderGraphs`) or a caller's wider pass (`xs` host codes:
        `CausalMaskedDiffWithXvec.run_encoder`)."""
        run = self.run if run is None else run
        pad_to = getattr(run, "padded_sizes", None)  # graphed: pack at the bucket
        inputs, num_frames = pack_encoder_inputs(self.config, xs, num_codes, last_chunk, caches,
                                                 pad_to)
        return unpack_encoder_outputs(run(inputs), num_frames, self.config.up_stride, caches)

    def run(self, inputs: EncoderInputs) -> EncoderOutputs:
        """The tensor part of `forward_chunk` (fixed shapes: CUDA-graph capturable)."""
        x = self.embed(inputs.xs) * inputs.code_valid[..., None]  # a final window's zero look-ahead
        x, conv2_in = self.pre_lookahead_layer(x, inputs.lookahead)
        x, token_kv = self._run_layers(self.encoders, x, inputs.token_kv, inputs.token_valid)
        x, up_in = self.up_layer(x, inputs.upsample)
        x, mel_kv = self._run_layers(self.up_encoders, self.up_embed(x), inputs.mel_kv,
                                     inputs.mel_valid)
        return EncoderOutputs(self.after_norm(x), conv2_in, up_in, token_kv, mel_kv)

    def _run_layers(
        self,
        layers: nn.ModuleList,
        x: torch.Tensor,  # [B, T_max, d]
        packed: torch.Tensor,  # [B, num_layers, H, C_max, 2 dk] left-padded caches
        key_valid: torch.Tensor,  # [B, C_max + T_max] bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (x, this window's keys | values [B, num_layers, H, T_max, 2 dk])."""
        pos_rows = self.position.relative_rows(packed.shape[3] + x.shape[1], x.shape[1])
        new = []
        for index, layer in enumerate(layers):
            x, new_kv = layer(x, packed[:, index], key_valid, pos_rows)
            new.append(new_kv)
        return x, torch.stack(new, dim=1)
