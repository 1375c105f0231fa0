"""HiFT residual blocks with Snake activations (`convs1`, `convs2`, `activations1/2.alpha`)."""

from __future__ import annotations

import torch
from torch import nn

_ALPHA_EPS = 1e-9  # keeps 1 / alpha finite for a zero alpha


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha with one learned alpha per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))  # [channels]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, channels, T]."""
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + _ALPHA_EPS)) * torch.sin(x * alpha).pow(2)


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

    def weight_norm_layers(self, prefix: str) -> list[str]:
        """Names of this block's convs stored weight-normalised in hift.pt."""
        count = len(self.convs1)
        return [f"{prefix}.{name}.{i}" for name in ("convs1", "convs2") for i in range(count)]
