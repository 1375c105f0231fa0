"""HiFT's excitation: an F0 predictor and a harmonic-plus-noise source (neural source-filter).

Names follow the reference (`f0_predictor.condnet.{0,2,4,6,8}`, `f0_predictor.classifier`,
`m_source.l_linear`). The source is the reference's `SourceModuleHnNSF2`
(docs/model_facts.md#code2wav-token2wav): harmonics f0 x [1 .. 9] of a phase that is accumulated
per mel frame and linearly interpolated to samples, gated by voicing, plus Gaussian noise
(nsf_sigma where voiced, nsf_alpha / 3 where not), merged by `l_linear` + tanh.

The noise is an argument (standard normal, drawn by the caller from the stream's own
generator), so a window's audio is a pure function of its inputs and the stream's state, and
tests can inject the reference's draws. The reference also adds a random initial phase at the
first sample; its linear down-sampling to frame rate reads only the two middle samples of each
frame, so that phase never reaches the output and is not modelled here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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
    def __init__(self, nb_harmonics: int, sampling_rate: int, hop: int, sine_amp: float,
                 noise_std: float, voiced_threshold: float) -> None:
        super().__init__()
        self.sampling_rate = sampling_rate
        self.hop = hop
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        self.num_sines = nb_harmonics + 1
        self.l_linear = nn.Linear(self.num_sines, 1)

    def forward(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """f0: [B, T] Hz per mel frame, noise: [B, hop T, nb_harmonics + 1] standard normal ->
        source [B, hop T] float32 in (-1, 1)."""
        harmonics = torch.arange(1, self.num_sines + 1, device=f0.device, dtype=f0.dtype)
        cycles = (f0[:, :, None] * harmonics / self.sampling_rate) % 1  # [B, T, H] per sample
        # phase at frame centres, then linear in between (held flat on the outer half frames)
        phase = torch.cumsum(cycles, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * self.hop, scale_factor=self.hop,
                              mode="linear").transpose(1, 2)  # [B, hop T, H]
        voiced = (f0 > self.voiced_threshold).float().repeat_interleave(self.hop, 1)[:, :, None]
        noise_amp = voiced * self.noise_std + (1 - voiced) * self.sine_amp / 3
        sines = self.sine_amp * torch.sin(phase) * voiced + noise_amp * noise
        return torch.tanh(self.l_linear(sines)).squeeze(-1)
