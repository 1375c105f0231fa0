"""The CFM estimator `DiT` (Step-Audio2 "DiT-v5", docs/model_facts.md#code2wav-token2wav):
velocity of the flow at time t for [x_t | mu | speaker | cond] mel-rate inputs.

Blocks are adaLN-Zero with three residual branches in the order attention, causal conv, MLP;
attention has per-head LayerNorm on q and k and no positional code (order comes from the
causal convs). Parameter names equal the reference's (`t_embedder.mlp.{0,2}`, `in_proj`,
`blocks.b.{attn,conv.block.{1,3,6},mlp.fc1/fc2,adaLN_modulation.1}`, `final_layer.*`).

`forward_chunk` runs one window for a batch of rows: each row's keys are [its window frames,
its cached frames] (the reference's newest-first order; without positions the order does not
change the result), right-padded and masked. With empty caches it is the reference's
whole-utterance `forward`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.config import DiTConfig

_BLOCK_NORM_EPS = 1e-6
_QK_NORM_EPS = 1e-5
_FREQUENCY_DIM = 256
_TIME_SCALE = 1000.0  # t in [0, 1] is embedded as t x 1000
_MAX_PERIOD = 10000.0
_CONV_KERNEL = 3
_CONV_CONTEXT = _CONV_KERNEL - 1
_NUM_MODULATIONS = 9
# shift, scale, gate for attention, MLP and conv, in this order: the scales are 1, 4 and 7
_SCALE_ONES = (0.0, 1.0, 0.0) * 3
_FINAL_SCALE_ONES = (0.0, 1.0)  # shift, scale


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(_FREQUENCY_DIM, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        half = _FREQUENCY_DIM // 2
        # computed once on the host, as the reference computes it each call, then moved along
        freqs = torch.exp(-math.log(_MAX_PERIOD) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)  # [128] float32

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t: [R] float32 in [0, 1] -> [R, hidden]; the sinusoid is laid out [cos | sin]."""
        args = (t.float() * _TIME_SCALE)[:, None] * self.freqs.float()[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(embedding.to(self.mlp[0].weight.dtype))


class Attention(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        inner = config.num_heads * config.head_dim
        self.num_heads = config.num_heads
        self.to_q = nn.Linear(config.hidden_size, inner)
        self.to_k = nn.Linear(config.hidden_size, inner)
        self.to_v = nn.Linear(config.hidden_size, inner)
        self.q_norm = nn.LayerNorm(config.head_dim, eps=_QK_NORM_EPS)
        self.k_norm = nn.LayerNorm(config.head_dim, eps=_QK_NORM_EPS)
        self.proj = nn.Linear(inner, config.hidden_size)

    def forward(
        self,
        x: torch.Tensor,  # [R, T, hidden]
        cache: torch.Tensor,  # [R, H, L, 2 head_dim] cached keys | values, right-padded
        key_valid: torch.Tensor,  # [R, T + L] bool over [window | cache]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (output [R, T, hidden], this window's keys | values [R, H, T, 2 head_dim])."""
        q = self.q_norm(self._heads(self.to_q(x)))
        new_kv = torch.cat([self.k_norm(self._heads(self.to_k(x))), self._heads(self.to_v(x))], -1)
        keys, values = torch.cat([new_kv, cache], dim=2).chunk(2, dim=-1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_valid[:, None, None, :])
        return self.proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)), new_kv

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[R, T, H head_dim] -> [R, H, T, head_dim]."""
        rows, length, _ = x.shape
        return x.view(rows, length, self.num_heads, -1).transpose(1, 2)


class Transpose(nn.Module):
    """Swaps time and channels inside `conv.block` (kept so parameter indices match)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class CausalConvBlock(nn.Module):
    """block: [0] T, [1] causal conv, [2] T, [3] LayerNorm, [4] Mish, [5] T, [6] causal conv, [7] T."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.block = nn.Sequential(
            Transpose(), nn.Conv1d(hidden, hidden, _CONV_KERNEL), Transpose(),
            nn.LayerNorm(hidden), nn.Mish(),
            Transpose(), nn.Conv1d(hidden, hidden, _CONV_KERNEL), Transpose(),
        )

    def forward(
        self,
        x: torch.Tensor,  # [R, T, hidden]
        cache: torch.Tensor,  # [R, 2 hidden, 2]: both convs' last two inputs
        num_new: torch.Tensor,  # [R] int64 valid window frames per row
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (output [R, T, hidden], new cache [R, 2 hidden, 2])."""
        first, second = cache.split(self.hidden, dim=1)
        conv1_in = torch.cat([first, x.transpose(1, 2)], dim=2)
        hidden = self.block[4](self.block[3](self.block[1](conv1_in).transpose(1, 2)))
        conv2_in = torch.cat([second, hidden.transpose(1, 2)], dim=2)
        out = self.block[6](conv2_in).transpose(1, 2)
        return out, torch.cat([_last_two(conv1_in, num_new), _last_two(conv2_in, num_new)], 1)


def _last_two(conv_in: torch.Tensor, num_new: torch.Tensor) -> torch.Tensor:
    """conv_in: [R, C, 2 + T] -> each row's two inputs before its frame num_new: [R, C, 2]."""
    index = num_new[:, None, None] + torch.arange(_CONV_CONTEXT, device=conv_in.device)
    return conv_in.gather(2, index.expand(-1, conv_in.shape[1], -1))


def gather_cache(pool: torch.Tensor, rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """pool: [pool rows, H, slots, 2 dk], rows: [R], order: [R, L] -> the dense cache
    [R, H, L, 2 dk] whose row r is pool row rows[r] at slots order[r] (the torch path's copy
    of what the fused kernel reads in place)."""
    picked = pool.index_select(0, rows)
    index = order[:, None, :, None].expand(-1, pool.shape[1], -1, pool.shape[3])
    return picked.gather(2, index)


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=_BLOCK_NORM_EPS)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=_BLOCK_NORM_EPS)
        self.mlp = MLP(hidden, config.mlp_hidden)
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False, eps=_BLOCK_NORM_EPS)
        self.conv = CausalConvBlock(hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, _NUM_MODULATIONS * hidden))

    def forward(
        self,
        x: torch.Tensor,  # [R, T, hidden]
        modulation: torch.Tensor,  # [R or 1, 9, hidden] from `DiT.modulations` (scales + 1)
        cnn_cache: torch.Tensor,  # [R, 2 hidden, 2]
        att_cache: torch.Tensor,  # [R, H, L, 2 head_dim]
        key_valid: torch.Tensor,  # [R, T + L] bool
        num_new: torch.Tensor,  # [R] int64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (x, new cnn cache [R, 2 hidden, 2], new keys | values [R, H, T, 2 head_dim])."""
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp,
         shift_conv, scale_conv, gate_conv) = modulation[:, :, None].unbind(1)  # [R, 1, hidden]
        attended, new_kv = self.attn(torch.addcmul(shift_msa, self.norm1(x), scale_msa),
                                     att_cache, key_valid)
        x = torch.addcmul(x, gate_msa, attended)
        conv, new_cnn = self.conv(torch.addcmul(shift_conv, self.norm3(x), scale_conv),
                                  cnn_cache, num_new)
        x = torch.addcmul(x, gate_conv, conv)
        mlp = self.mlp(torch.addcmul(shift_mlp, self.norm2(x), scale_mlp))
        return torch.addcmul(x, gate_mlp, mlp), new_cnn, new_kv


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=_BLOCK_NORM_EPS)
        self.linear = nn.Linear(hidden, out_channels)

    def forward(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        """x: [R, T, hidden], modulation: [R or 1, 2, hidden] (shift, scale + 1)."""
        shift, scale = modulation[:, :, None].unbind(1)
        return self.linear(torch.addcmul(shift, self.norm_final(x), scale))


class DiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        self.t_embedder = TimestepEmbedder(config.hidden_size)
        self.in_proj = nn.Linear(config.in_channels, config.hidden_size)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        self.final_layer = FinalLayer(config.hidden_size, config.out_channels)
        # fused kernels (`dit_fused`): None = on CUDA only; True also runs them elsewhere
        # (Triton's interpreter in the CPU tests); False keeps the torch path everywhere
        self.fused: bool | None = None
        # buffers, so the graphed solve never copies from the host
        self.register_buffer("scale_ones", torch.tensor(_SCALE_ONES)[:, None], persistent=False)
        # scale_ones: [9, 1] float32
        self.register_buffer("final_scale_ones", torch.tensor(_FINAL_SCALE_ONES)[:, None],
                             persistent=False)  # [2, 1] float32

    def modulations(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """t: [N] float32 -> the adaLN outputs of every block [depth, N, 9, hidden] and of the
        final layer [N, 2, hidden], with 1 added to the scales (they enter as 1 + scale).

        They depend on t alone (the speaker enters through the input), so the CFM computes
        them once per window for all its steps instead of once per step and block."""
        hidden = self.config.hidden_size
        c = self.t_embedder(t)
        blocks = torch.stack([b.adaLN_modulation(c) for b in self.blocks])
        blocks = blocks.unflatten(-1, (_NUM_MODULATIONS, hidden)) + self.scale_ones.to(c.dtype)
        final = self.final_layer.adaLN_modulation(c).unflatten(-1, (2, hidden))
        return blocks, final + self.final_scale_ones.to(c.dtype)

    def wants_fused_kernels(self, like: torch.Tensor) -> bool:
        """The `fused` switch for work on `like`'s device: None = the kernels on CUDA only."""
        return like.is_cuda if self.fused is None else self.fused

    def uses_fused_kernels(self, inputs: torch.Tensor) -> bool:
        """The fused path needs two window frames per row (its conv taps place the two
        cached frames from the first two frames' programs); shorter windows run in torch."""
        return self.wants_fused_kernels(inputs) and inputs.shape[2] >= _CONV_CONTEXT

    def forward_chunk(
        self,
        inputs: torch.Tensor,  # [R, 320, T] x_t | mu | speaker | cond
        t: torch.Tensor,  # [R] float32
        cnn_cache: torch.Tensor,  # [depth, R, 2 hidden, 2]
        att_cache: torch.Tensor,  # [depth, R, H, L, 2 head_dim]
        key_valid: torch.Tensor,  # [R, T + L] bool over [window | cache]
        num_new: torch.Tensor,  # [R] int64 valid window frames per row
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (velocity [R, 80, T], new cnn caches [depth, R, 2 hidden, 2],
        new keys | values [depth, R, H, T, 2 head_dim])."""
        blocks, final = self.modulations(t)
        return self.forward_modulated(inputs, blocks, final, cnn_cache, att_cache, key_valid, num_new)

    def forward_modulated(
        self,
        inputs: torch.Tensor,  # [R, 320, T]
        blocks: torch.Tensor,  # [depth, R or 1, 9, hidden] from `modulations`
        final: torch.Tensor,  # [R or 1, 2, hidden]
        cnn_cache: torch.Tensor,  # [depth, R, 2 hidden, 2]
        att_cache: torch.Tensor,  # [depth, R, H, L, 2 head_dim]
        key_valid: torch.Tensor,  # [R, T + L] bool
        num_new: torch.Tensor,  # [R] int64
        cache_index: tuple[torch.Tensor, torch.Tensor] | None = None,  # pooled: rows, order
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`forward_chunk` with the time conditioning already computed. With `cache_index`,
        att_cache is a pool [depth, pool rows, H, slots, 2 head_dim] read through
        (rows [R], order [R, L]) as `gather_cache` describes."""
        if self.uses_fused_kernels(inputs):
            from backends.models.token2wav.dit_fused import fused_forward  # imports Triton

            return fused_forward(self, inputs, blocks, final, cnn_cache, att_cache, key_valid,
                                 num_new, cache_index)
        x = self.in_proj(inputs.transpose(1, 2))
        new_cnn, new_kv = [], []
        for index, block in enumerate(self.blocks):
            cache = att_cache[index]
            if cache_index is not None:
                cache = gather_cache(cache, *cache_index)
            x, cnn, kv = block(x, blocks[index], cnn_cache[index], cache, key_valid, num_new)
            new_cnn.append(cnn)
            new_kv.append(kv)
        velocity = self.final_layer(x, final).transpose(1, 2)
        return velocity, torch.stack(new_cnn), torch.stack(new_kv)
