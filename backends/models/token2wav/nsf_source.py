"""HiFT's excitation: an F0 predictor and a harmonic sine source (neural source-filter).

Names follow the reference (`f0_predictor.condnet.{0,2,4,6,8}`, `f0_predictor.classifier`,
`m_source.l_linear`). Simplification: the reference draws a random initial phase and additive
noise on every call; here both are left out so a window's audio is a pure function of its
inputs and state (batched equals unbatched, tests compare exactly).
"""

from __future__ import annotations

import math

import torch
from torch import nn

_NUM_CONDNET_CONVS = 5


class ConvRNNF0Predictor(nn.Module):
    def __init__(self, in_channels: int, cond_channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(_NUM_CONDNET_CONVS):
            width = in_channels if i == 0 else cond_channels
            layers += [nn.Conv1d(width, cond_channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [B, 80, T] -> f0 [B, T] in Hz (non-negative)."""
        hidden = self.condnet(mel).transpose(1, 2)
        return self.classifier(hidden).squeeze(-1).abs()

    def weight_norm_layers(self, prefix: str) -> list[str]:
        return [f"{prefix}.condnet.{2 * i}" for i in range(_NUM_CONDNET_CONVS)]


class SourceModuleHnNSF(nn.Module):
    """Sines at f0 x [1 .. nb_harmonics + 1], gated by voicing, merged by `l_linear` + tanh."""

    def __init__(
        self, nb_harmonics: int, sampling_rate: int, sine_amp: float, voiced_threshold: float
    ) -> None:
        super().__init__()
        self.sampling_rate = sampling_rate
        self.sine_amp = sine_amp
        self.voiced_threshold = voiced_threshold
        self.l_linear = nn.Linear(nb_harmonics + 1, 1)
        self.register_buffer(
            "harmonics", torch.arange(1, nb_harmonics + 2, dtype=torch.float64), persistent=False
        )  # [nb_harmonics + 1] float64

    def forward(self, f0: torch.Tensor, hop: int) -> torch.Tensor:
        """f0: [B, T] Hz per mel frame (held for `hop` samples) -> source [B, T hop] float32."""
        batch, num_frames = f0.shape
        # cycles per sample of each harmonic, constant within a frame
        step = (f0.double()[..., None] * self.harmonics / self.sampling_rate) % 1.0  # [B, T, H]
        # running phase at frame starts in float64 (a float32 sum over ~30k samples drifts);
        # within a frame at most `hop` steps accumulate, which float32 resolves well
        start = (torch.cumsum(step * hop, dim=1) - step * hop) % 1.0
        ramp = torch.arange(1, hop + 1, dtype=torch.float32, device=f0.device)[:, None]
        phase = start.float()[:, :, None, :] + ramp * step.float()[:, :, None, :]  # [B, T, hop, H]
        sines = self.sine_amp * torch.sin((2.0 * math.pi) * phase)
        sines = sines * (f0 > self.voiced_threshold)[:, :, None, None]
        source = torch.tanh(self.l_linear(sines)).squeeze(-1)
        return source.reshape(batch, num_frames * hop)
