"""Streaming `UpsampleConformerEncoderV2`: code embeddings -> mel-rate features.

Structure and parameter names follow the reference (token2wav_facts.md 1.4): `embed` (Linear +
LayerNorm, x sqrt(d)) -> `pre_lookahead_layer` (conv1 consumes the 3 look-ahead codes, leaky
ReLU 0.01, conv2 is causal with a 2-frame cache) -> token-rate `encoders` -> `up_layer` (nearest
x2 + causal conv with a 4-frame cache) -> `up_embed` -> mel-rate `up_encoders` -> `after_norm`.
A non-final window of N codes yields N - 3 code frames (2 (N - 3) mel frames); a final window
is zero-padded by 3 frames after `embed` and yields all N. With empty caches and one final
window this is the reference's whole-utterance `forward`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.batching import key_mask, left_pad, take_frames
from backends.models.token2wav.config import EncoderConfig
from backends.models.token2wav.conformer import ConformerEncoderLayer
from backends.models.token2wav.rel_position import RelPositionalEncoding

_EMBED_NORM_EPS = 1e-5
_LOOKAHEAD_SLOPE = 0.01  # F.leaky_relu's default, as in the reference pre-lookahead layer
_CONV2_CONTEXT = 2  # conv2 kernel 3 -> 2 frames of left context


@dataclass(slots=True)
class EncoderCache:
    """One stream's encoder state between windows (time axes oldest first)."""

    lookahead: torch.Tensor  # [d, 2] float32: the last two conv1 outputs (conv2's context)
    upsample: torch.Tensor  # [d, 2 stride] float32: the last up-sampled frames
    token_kv: torch.Tensor  # [num_blocks, H, T1, 2 dk] float32 token-rate keys | values
    mel_kv: torch.Tensor  # [num_up_blocks, H, L, 2 dk] float32 mel-rate keys | values


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
        self.conv2 = nn.Conv1d(size, size, kernel_size=_CONV2_CONTEXT + 1)

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

    def new_cache(self, device: torch.device | str) -> EncoderCache:
        c = self.config
        head_dim = c.output_size // c.attention_heads
        kv = (c.attention_heads, 0, 2 * head_dim)
        like = {"device": device, "dtype": self.after_norm.weight.dtype}
        return EncoderCache(
            lookahead=torch.zeros(c.output_size, _CONV2_CONTEXT, **like),
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
        lookahead, stride = self.config.pre_lookahead_len, self.config.up_stride
        num_frames = [n - lookahead * (not last) for n, last in zip(num_codes, last_chunk)]
        if min(num_frames) < 1:
            raise ValueError(f"every non-final window needs more than {lookahead} codes, "
                             f"got {num_codes}")
        x = self._embed_padded(xs, num_codes, max(num_frames) + lookahead)
        x, conv2_in = self.pre_lookahead_layer(x, torch.stack([c.lookahead for c in caches]))
        x, token_kv = self._run_layers(self.encoders, x, [c.token_kv for c in caches], num_frames)
        x, up_in = self.up_layer(x, torch.stack([c.upsample for c in caches]))
        mel_frames = [stride * n for n in num_frames]
        x, mel_kv = self._run_layers(
            self.up_encoders, self.up_embed(x), [c.mel_kv for c in caches], mel_frames
        )
        new_caches = [
            EncoderCache(
                lookahead=take_frames(conv2_in[b], n, _CONV2_CONTEXT),
                upsample=take_frames(up_in[b], m, 2 * stride),
                token_kv=token_kv[b],
                mel_kv=mel_kv[b],
            )
            for b, (n, m) in enumerate(zip(num_frames, mel_frames))
        ]
        return self.after_norm(x), mel_frames, new_caches

    def _embed_padded(self, xs: torch.Tensor, num_codes: list[int], length: int) -> torch.Tensor:
        """Embed, zero every frame past a row's codes (this is also a final window's zero
        look-ahead, added after `embed` as in the reference), pad or cut to `length` frames."""
        x = self.embed(xs)
        count = torch.tensor(num_codes, device=x.device)
        x = x * (torch.arange(x.shape[1], device=x.device)[None, :] < count[:, None])[..., None]
        return F.pad(x, (0, 0, 0, max(0, length - x.shape[1])))[:, :length]

    def _run_layers(
        self,
        layers: nn.ModuleList,
        x: torch.Tensor,  # [B, T_max, d]
        caches: list[torch.Tensor],  # per row [num_layers, H, C_b, 2 dk]
        num_new: list[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """-> (x, per row [num_layers, H, C_b + num_new_b, 2 dk] grown caches)."""
        cache_lens = [c.shape[2] for c in caches]
        packed = left_pad(caches, dim=2)  # [B, num_layers, H, C_max, 2 dk]
        num_keys = packed.shape[3] + x.shape[1]
        key_valid = key_mask(cache_lens, packed.shape[3], num_new, x.shape[1], x.device)
        pos_rows = self.position.relative_rows(num_keys, x.shape[1])
        new = []
        for index, layer in enumerate(layers):
            x, new_kv = layer(x, packed[:, index], key_valid, pos_rows)
            new.append(new_kv)
        stacked = torch.stack(new, dim=1)  # [B, num_layers, H, T_max, 2 dk]
        grown = [torch.cat([caches[b], stacked[b, :, :, :n]], dim=2) for b, n in enumerate(num_new)]
        return x, grown
