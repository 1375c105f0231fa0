"""HiFT residual blocks with Snake activations (`convs1`, `convs2`, `activations1/2.alpha`).

`forward` is the torch expression (the reference, used on CPU); `fused_forward` computes the
same with the elementwise work between the convs in `snake_kernel` passes (the CUDA path)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from backends.models.token2wav.snake_kernel import MeanLeakyAct

ALPHA_EPS = 1e-9  # keeps 1 / alpha finite for a zero alpha


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha with one learned alpha per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))  # [channels]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, channels, T]."""
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + ALPHA_EPS)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Per dilation d: x += conv2(snake(conv1_d(snake(x)))); lengths are preserved."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(
                channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2
            )
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2)
            for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, channels, T] -> same shape."""
        layers = zip(self.convs1, self.convs2, self.activations1, self.activations2)
        for conv1, conv2, act1, act2 in layers:
            x = x + conv2(act2(conv1(act1(x))))
        return x

    def fused_forward(self, y: torch.Tensor, bias: torch.Tensor | None,
                      extra: torch.Tensor | None = None,
                      final: MeanLeakyAct | None = None) -> torch.Tensor:
        """`extra + forward(y + bias)` (bias, extra optional; y: [B, channels, T] float32
        contiguous), or with `final` that result's mean-leaky activation (`snake_kernel`).
        Each conv's bias, the residual adds and the next Snake are one pass."""
        from backends.models.token2wav.snake_kernel import SnakeAct, conv_epilogue, conv_no_bias

        x, act = conv_epilogue(y, bias, act=SnakeAct(self.activations1[0].alpha),
                               keep_sum=bias is not None)
        x = y if x is None else x
        last = len(self.convs1) - 1
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2)):
            hidden = conv_epilogue(conv_no_bias(conv1, act), conv1.bias,
                                   act=SnakeAct(self.activations2[i].alpha))[1]
            out = conv_no_bias(conv2, hidden)
            if i < last:  # x += conv2(...), and the next dilation's first Snake of it
                x, act = conv_epilogue(out, conv2.bias, x, act=SnakeAct(
                    self.activations1[i + 1].alpha), keep_sum=True)
        summed, activated = conv_epilogue(out, conv2.bias, x, extra, final, keep_sum=final is None)
        result = summed if final is None else activated
        assert result is not None
        return result

    def weight_norm_layers(self, prefix: str) -> list[str]:
        """Names of this block's convs stored weight-normalised in hift.pt."""
        count = len(self.convs1)
        return [f"{prefix}.{name}.{i}" for name in ("convs1", "convs2") for i in range(count)]
