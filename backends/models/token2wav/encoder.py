"""Streaming up-sampling Conformer encoder: code embeddings -> mel-rate features.

Structure and parameter names follow Step-Audio2's `UpsampleConformerEncoderV2`
(token2wav_facts.md 1.4): `embed` (Linear + LayerNorm, x sqrt(d)) -> `pre_lookahead_layer`
(conv1 consumes the 3 look-ahead codes, conv2 is causal with a 2-frame cache) -> token-rate
`encoders` -> `up_layer` (nearest x2 + causal conv with a 4-frame cache) -> `up_embed` ->
mel-rate `up_encoders` -> `after_norm`. A non-final window of N codes yields N - 3 code frames
(2 (N - 3) mel frames); a final window is zero-padded by 3 frames and yields all N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.config import EncoderConfig
from backends.models.token2wav.conformer import ConformerEncoderLayer, key_mask, left_pad_stack

_EMBED_NORM_EPS = 1e-5
_LOOKAHEAD_SLOPE = 0.01  # F.leaky_relu default, as in the reference pre-lookahead layer
_CONV2_CACHE = 2  # conv2 kernel 3 -> 2 frames of left context
_UP_CONV_KERNEL = 5
_UP_CACHE = _UP_CONV_KERNEL - 1


@dataclass(slots=True)
class EncoderCache:
    """One stream's encoder state between windows (chronological, oldest first)."""

    lookahead: torch.Tensor  # [2, d] last conv2 inputs of the pre-lookahead layer
    upsample: torch.Tensor  # [4, d] last up-sampled frames before the up conv
    keys: list[torch.Tensor]  # per layer [num_cached, d]; token-rate layers first
    values: list[torch.Tensor]  # per layer [num_cached, d]


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
        self.conv2 = nn.Conv1d(size, size, kernel_size=_CONV2_CACHE + 1)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, M, d] (zeros past each row's frames), cache: [B, 2, d] ->
        (out [B, M - lookahead, d], conv2 input incl. cache [B, M - lookahead + 2, d])."""
        hidden = F.leaky_relu(self.conv1(x.transpose(1, 2)), _LOOKAHEAD_SLOPE)
        conv2_in = torch.cat([cache.transpose(1, 2), hidden], dim=2)
        out = self.conv2(conv2_in).transpose(1, 2)
        return out + x[:, : x.shape[1] - self.lookahead], conv2_in.transpose(1, 2)


class Upsample1D(nn.Module):
    def __init__(self, size: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(size, size, kernel_size=_UP_CONV_KERNEL)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, L, d], cache: [B, 4, d] ->
        (out [B, stride L, d], conv input [B, 4 + stride L, d])."""
        conv_in = torch.cat([cache, x.repeat_interleave(self.stride, dim=1)], dim=1)
        return self.conv(conv_in.transpose(1, 2)).transpose(1, 2), conv_in


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, input_size: int, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        size = config.output_size
        self.embed = LinearNoSubsampling(input_size, size)
        self.pre_lookahead_layer = PreLookaheadLayer(size, config.pre_lookahead_len)
        self.encoders = nn.ModuleList(self._layer() for _ in range(config.num_blocks))
        self.up_layer = Upsample1D(size, config.up_stride)
        self.up_embed = LinearNoSubsampling(size, size)
        self.up_encoders = nn.ModuleList(self._layer() for _ in range(config.num_up_blocks))
        self.after_norm = nn.LayerNorm(size, eps=_EMBED_NORM_EPS)

    def _layer(self) -> ConformerEncoderLayer:
        c = self.config
        return ConformerEncoderLayer(c.output_size, c.attention_heads, c.linear_units)

    def new_cache(self, device: torch.device) -> EncoderCache:
        size = self.config.output_size
        num_layers = self.config.num_blocks + self.config.num_up_blocks
        empty = [torch.zeros(0, size, device=device) for _ in range(num_layers)]
        return EncoderCache(
            lookahead=torch.zeros(_CONV2_CACHE, size, device=device),
            upsample=torch.zeros(_UP_CACHE, size, device=device),
            keys=list(empty),
            values=list(empty),
        )

    def forward_chunk(
        self,
        xs: torch.Tensor,  # [B, N_max, input_size] code embeddings, any value past a row's codes
        num_codes: list[int],  # codes per row
        last_chunk: list[bool],  # a final row decodes its look-ahead (zero-padded)
        caches: list[EncoderCache],
    ) -> tuple[torch.Tensor, list[int], list[EncoderCache]]:
        """-> (features [B, T_max, d] at mel rate, valid mel frames per row, new caches)."""
        lookahead, stride = self.config.pre_lookahead_len, self.config.up_stride
        num_frames = [n - lookahead * (not last) for n, last in zip(num_codes, last_chunk)]
        if min(num_frames) < 1:
            raise ValueError(
                f"every non-final window needs more than {lookahead} codes, got {num_codes}"
            )
        x = self._embed_padded(xs, num_codes, max(num_frames) + lookahead)
        x, conv2_in = self.pre_lookahead_layer(x, torch.stack([c.lookahead for c in caches]))
        x, keys, values = self._run_layers(self.encoders, 0, x, num_frames, caches)
        x, up_in = self.up_layer(x, torch.stack([c.upsample for c in caches]))
        mel_frames = [stride * n for n in num_frames]
        x = self.up_embed(x)
        x, up_keys, up_values = self._run_layers(
            self.up_encoders, self.config.num_blocks, x, mel_frames, caches
        )
        new_caches = [
            EncoderCache(
                lookahead=conv2_in[b, n : n + _CONV2_CACHE].clone(),
                upsample=up_in[b, m : m + _UP_CACHE].clone(),
                keys=keys[b] + up_keys[b],
                values=values[b] + up_values[b],
            )
            for b, (n, m) in enumerate(zip(num_frames, mel_frames))
        ]
        return self.after_norm(x), mel_frames, new_caches

    def _embed_padded(self, xs: torch.Tensor, num_codes: list[int], length: int) -> torch.Tensor:
        """Embed, zero every frame past a row's codes (this is also the final window's
        zero look-ahead), and pad or cut to `length` frames."""
        x = self.embed(xs)
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < torch.tensor(
            num_codes, device=x.device
        )[:, None]
        x = x * valid[..., None]
        if x.shape[1] < length:
            x = F.pad(x, (0, 0, 0, length - x.shape[1]))
        return x[:, :length]

    def _run_layers(
        self,
        layers: nn.ModuleList,
        first_layer: int,
        x: torch.Tensor,  # [B, T_max, d]
        num_new: list[int],
        caches: list[EncoderCache],
    ) -> tuple[torch.Tensor, list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        """-> (x, per-row new keys per layer, per-row new values per layer)."""
        size = self.config.output_size
        cap = self.config.max_cache_frames // (self.config.up_stride if first_layer == 0 else 1)
        new_keys: list[list[torch.Tensor]] = [[] for _ in caches]
        new_values: list[list[torch.Tensor]] = [[] for _ in caches]
        for offset, layer in enumerate(layers):
            idx = first_layer + offset
            old_k = [c.keys[idx] for c in caches]
            old_v = [c.values[idx] for c in caches]
            cache_k, cache_v = left_pad_stack(old_k, size), left_pad_stack(old_v, size)
            cache_lens = [k.shape[0] for k in old_k]
            mask = key_mask(cache_lens, cache_k.shape[1], num_new, x.shape[1], x.device)
            x, k_new, v_new = layer(x, cache_k, cache_v, mask)
            for b, n in enumerate(num_new):
                new_keys[b].append(torch.cat([old_k[b], k_new[b, :n]])[-cap:])
                new_values[b].append(torch.cat([old_v[b], v_new[b, :n]])[-cap:])
        return x, new_keys, new_values
