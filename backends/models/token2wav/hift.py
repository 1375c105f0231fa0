"""HiFT vocoder (NSF + ISTFTNet): mel [80, T] -> 24 kHz audio, 480 samples per mel frame.

Structure and parameter names follow the CosyVoice2-style `HiFTGenerator` (token2wav_facts.md
1.8 and 2.2): `conv_pre` -> 3 x (leaky ReLU, transposed conv `ups.i` x8/x5/x3, plus the
down-sampled STFT of the harmonic source through `source_downs.i` + `source_resblocks.i`, then
the mean of `resblocks`) -> `conv_post` -> magnitude/phase -> ISTFT (n_fft 16, hop 4, x4).
Weights are plain here: hift.pt stores the weight-normalised layers as (g, v) and the loader
folds them (backends.models.weight_norm). The source noise is an argument (`nsf_source`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.config import HiFTConfig
from backends.models.token2wav.nsf_source import ConvRNNF0Predictor, SourceModuleHnNSF
from backends.models.token2wav.resblock import ResBlock

_MAX_MAGNITUDE = 100.0  # exp() of the predicted log-magnitude is clipped here
_POST_SLOPE = 0.01  # F.leaky_relu default after the last stage, as in the reference


class HiFTGenerator(nn.Module):
    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.config = config
        channels = [config.base_channels // 2**i for i in range(len(config.upsample_rates) + 1)]
        num_freq = config.istft_n_fft // 2 + 1
        self.f0_predictor = ConvRNNF0Predictor(config.in_channels, config.f0_cond_channels)
        self.m_source = SourceModuleHnNSF(
            config.nb_harmonics, config.sampling_rate, config.hop_samples, config.nsf_alpha,
            config.nsf_sigma, config.nsf_voiced_threshold,
        )
        self.conv_pre = nn.Conv1d(config.in_channels, channels[0], 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(channels[i], channels[i + 1], k, stride=u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes))
        )
        self.source_downs = nn.ModuleList(
            self._source_down(2 * num_freq, channels[i + 1], i)
            for i in range(len(config.upsample_rates))
        )
        self.source_resblocks = nn.ModuleList(
            ResBlock(channels[i + 1], k, d)
            for i, (k, d) in enumerate(
                zip(config.source_resblock_kernel_sizes, config.source_resblock_dilation_sizes)
            )
        )
        self.resblocks = nn.ModuleList(
            ResBlock(channels[i + 1], k, d)
            for i in range(len(config.upsample_rates))
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.reflection_pad = nn.ReflectionPad1d((1, 0))
        self.conv_post = nn.Conv1d(channels[-1], 2 * num_freq, 7, padding=3)
        window = torch.hann_window(config.istft_n_fft, periodic=True, dtype=torch.float32)
        self.register_buffer("stft_window", window, persistent=False)  # [n_fft] float32

    def _source_down(self, in_channels: int, out_channels: int, stage: int) -> nn.Conv1d:
        """Brings the source STFT (hop 4) to the length of stage `stage`'s output."""
        stride = math.prod(self.config.upsample_rates[stage + 1 :])
        if stride == 1:
            return nn.Conv1d(in_channels, out_channels, 1)
        return nn.Conv1d(in_channels, out_channels, 2 * stride, stride=stride, padding=stride // 2)

    def weight_norm_layers(self) -> list[str]:
        """Module names stored weight-normalised in the reference hift.pt."""
        names = ["conv_pre", "conv_post"] + [f"ups.{i}" for i in range(len(self.ups))]
        names += self.f0_predictor.weight_norm_layers("f0_predictor")
        for group in ("resblocks", "source_resblocks"):
            for i, block in enumerate(getattr(self, group)):
                names += block.weight_norm_layers(f"{group}.{i}")
        return names

    def num_noise_channels(self) -> int:
        return self.config.nb_harmonics + 1

    def forward(
        self,
        mel: torch.Tensor,  # [B, 80, T] float32, all rows T frames
        source_cache: list[torch.Tensor],  # per row [n_b] float32, n_b <= 480 T
        noise: torch.Tensor,  # [B, 480 T, nb_harmonics + 1] float32 standard normal
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (speech [B, 480 T] float32 in [-0.99, 0.99], source [B, 480 T] float32).

        A row's cached source replaces the start of its new source, so the excitation of the
        re-fed mel frames matches what the previous window used."""
        source = self.m_source(self.f0_predictor(mel), noise)
        for batch_idx, cached in enumerate(source_cache):
            source[batch_idx, : cached.shape[0]] = cached
        return self.to_audio(self.spectrum(mel, source)), source

    def uniform_spectrum(
        self,
        mel: torch.Tensor,  # [B, 80, T] float32
        source_cache: torch.Tensor,  # [B, C] float32, one cache length C for every row
        noise: torch.Tensor,  # [B, 480 T, nb_harmonics + 1] float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` up to the ISTFT for rows with equal cache lengths (fixed shapes, no host
        sync: CUDA-graph safe) -> (spectrum [B, n_fft + 2, 480 T / hop + 1], source)."""
        source = self.m_source(self.f0_predictor(mel), noise)
        source[:, : source_cache.shape[1]] = source_cache
        return self.spectrum(mel, source), source

    def spectrum(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel: [B, 80, T], source: [B, 480 T] -> log-magnitude | phase [B, n_fft + 2, F]."""
        source_spec = self._stft(source)
        x = self.conv_pre(mel)
        num_kernels = len(self.config.resblock_kernel_sizes)
        for stage, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, self.config.lrelu_slope))
            if stage == len(self.ups) - 1:
                x = self.reflection_pad(x)
            x = x + self.source_resblocks[stage](self.source_downs[stage](source_spec))
            blocks = self.resblocks[stage * num_kernels : (stage + 1) * num_kernels]
            x = sum(block(x) for block in blocks) / num_kernels
        return self.conv_post(F.leaky_relu(x, _POST_SLOPE))

    def to_audio(self, spectrum: torch.Tensor) -> torch.Tensor:
        """[B, n_fft + 2, F] -> speech [B, hop (F - 1)] clipped to the audio limit."""
        return self._istft(spectrum).clamp(-self.config.audio_limit, self.config.audio_limit)

    def _stft(self, signal: torch.Tensor) -> torch.Tensor:
        """[B, S] -> [B, 2 (n_fft/2 + 1), S / hop + 1]: real parts, then imaginary parts."""
        spec = torch.stft(
            signal, self.config.istft_n_fft, self.config.istft_hop_len,
            self.config.istft_n_fft, window=self.stft_window, return_complex=True,
        )
        return torch.cat([spec.real, spec.imag], dim=1)

    def _istft(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 2 (n_fft/2 + 1), F] log-magnitude | phase channels -> [B, hop (F - 1)]."""
        num_freq = self.config.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :num_freq]).clamp(max=_MAX_MAGNITUDE)
        phase = torch.sin(x[:, num_freq:])
        spec = torch.polar(magnitude, phase)
        return torch.istft(
            spec, self.config.istft_n_fft, self.config.istft_hop_len,
            self.config.istft_n_fft, window=self.stft_window,
        )
