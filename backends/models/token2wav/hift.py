"""HiFT vocoder (NSF + ISTFTNet): mel [80, T] -> 24 kHz audio, 480 samples per mel frame.

Structure and parameter names follow the CosyVoice2-style `HiFTGenerator`
(docs/model_facts.md#code2wav-token2wav): `conv_pre` -> 3 x (leaky ReLU, transposed conv `ups.i`
x8/x5/x3, plus the down-sampled STFT of the harmonic source through `source_downs.i` +
`source_resblocks.i`, then the mean of `resblocks`) -> `conv_post` -> magnitude/phase -> ISTFT
(n_fft 16, hop 4, x4). Weights are plain here: hift.pt stores the weight-normalised layers as (g,
v) and the loader folds them (backends.models.weight_norm). The source noise is an argument
(`nsf_source`).

On CUDA the elementwise work between the convs (biases, Snakes, residual adds, the resblock
mean and leaky ReLU) runs as fused `snake_kernel` passes (`fused`; the torch expressions stay
the CPU path and the reference). The ISTFT is torch's, op for op, but with its window
envelope computed and checked once per length instead of every call (a host sync), so the
whole vocoder can replay from one CUDA graph (`uniform_forward`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

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
        # fused elementwise kernels (`snake_kernel`): None = on CUDA only; True also elsewhere
        # (CPU: only under Triton's interpreter, for tests); False = the torch expressions
        self.fused: bool | None = None
        # let cuDNN time its algorithms for HiFT's fixed conv shapes (first call per shape,
        # i.e. at graph warm-up); off by default, an opt-in for measurements
        self.cudnn_benchmark = False
        self._envelopes: dict[tuple[int, torch.device], torch.Tensor] = {}

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

    def uses_fused_kernels(self, x: torch.Tensor) -> bool:
        return x.is_cuda if self.fused is None else self.fused

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
        source_cache: torch.Tensor,  # [B, C] float32, row b's cache in its first lengths[b]
        noise: torch.Tensor,  # [B, 480 T, nb_harmonics + 1] float32
        cache_lengths: torch.Tensor | None = None,  # [B] int64; None: every row holds C
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` up to the ISTFT with the caches as one padded tensor (fixed shapes, no
        host sync: CUDA-graph safe) -> (spectrum [B, n_fft + 2, 480 T / hop + 1], source)."""
        source = self.m_source(self.f0_predictor(mel), noise)
        width = source_cache.shape[1]
        if cache_lengths is None:
            source[:, :width] = source_cache
        else:
            cached = torch.arange(width, device=mel.device) < cache_lengths[:, None]
            source[:, :width] = torch.where(cached, source_cache, source[:, :width])
        return self.spectrum(mel, source), source

    def uniform_forward(self, mel: torch.Tensor, source_cache: torch.Tensor, noise: torch.Tensor,
                        cache_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`uniform_spectrum` through the ISTFT -> (speech [B, 480 T], source [B, 480 T]); no
        host sync once this length's ISTFT envelope exists (made by a first call)."""
        spectrum, source = self.uniform_spectrum(mel, source_cache, noise, cache_lengths)
        return self.to_audio(spectrum), source

    def spectrum(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel: [B, 80, T], source: [B, 480 T] -> log-magnitude | phase [B, n_fft + 2, F]."""
        with self._cudnn_flags():
            source_spec = self._stft(source)
            if self.uses_fused_kernels(mel):
                return self._fused_spectrum(mel, source_spec)
            return self._torch_spectrum(mel, source_spec)

    @contextlib.contextmanager
    def _cudnn_flags(self) -> Iterator[None]:
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = saved or self.cudnn_benchmark
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = saved

    def _torch_spectrum(self, mel: torch.Tensor, source_spec: torch.Tensor) -> torch.Tensor:
        """The reference's expressions, op by op."""
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

    def _fused_spectrum(self, mel: torch.Tensor, source_spec: torch.Tensor) -> torch.Tensor:
        """`_torch_spectrum` with `snake_kernel` passes: each stage's source branch ends in
        the add of the up-sampled x, and its last resblock in the mean + next leaky ReLU."""
        from backends.models.token2wav.snake_kernel import MeanLeakyAct, conv_no_bias

        num_kernels = len(self.config.resblock_kernel_sizes)
        act = F.leaky_relu(self.conv_pre(mel), self.config.lrelu_slope)
        for stage, up in enumerate(self.ups):
            x = up(act)
            last_stage = stage == len(self.ups) - 1
            if last_stage:
                x = self.reflection_pad(x)
            down = self.source_downs[stage]
            x = self.source_resblocks[stage].fused_forward(
                conv_no_bias(down, source_spec), down.bias, extra=x)
            blocks = self.resblocks[stage * num_kernels : (stage + 1) * num_kernels]
            slope = _POST_SLOPE if last_stage else self.config.lrelu_slope
            final = MeanLeakyAct(num_kernels, slope)
            acc = None
            for k, block in enumerate(blocks):
                acc = block.fused_forward(x, None, acc, final if k == num_kernels - 1 else None)
            assert acc is not None
            act = acc
        return self.conv_post(act)

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
        """[B, 2 (n_fft/2 + 1), F] log-magnitude | phase channels -> [B, hop (F - 1)].

        torch.istft (centered, one-sided, "backward" norm) op for op, so the samples are the
        same, but with the window envelope cached per F (torch checks it on the host every
        call)."""
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop_len
        num_freq = n_fft // 2 + 1
        magnitude = torch.exp(x[:, :num_freq]).clamp(max=_MAX_MAGNITUDE)
        phase = torch.sin(x[:, num_freq:])
        spec = torch.polar(magnitude, phase)  # [B, num_freq, F]
        frames = torch.fft.irfft(spec.transpose(1, 2), n=n_fft, dim=-1, norm="backward")
        frames = frames * self.stft_window.view(1, 1, n_fft)  # [B, F, n_fft]
        length = n_fft + hop * (frames.shape[1] - 1)
        signal = torch.ops.aten.unfold_backward(frames, [frames.shape[0], length], 1, n_fft, hop)
        return signal[:, n_fft // 2 : length - n_fft // 2] / self._envelope(frames.shape[1])

    def _envelope(self, num_frames: int) -> torch.Tensor:
        """Overlap-added squared window of `num_frames` frames, trimmed: [1, hop (F - 1)]."""
        key = (num_frames, self.stft_window.device)
        envelope = self._envelopes.get(key)
        if envelope is None:
            n_fft, hop = self.config.istft_n_fft, self.config.istft_hop_len
            length = n_fft + hop * (num_frames - 1)
            squares = self.stft_window.pow(2).expand(1, num_frames, n_fft)
            envelope = torch.ops.aten.unfold_backward(squares, [1, length], 1, n_fft, hop)
            envelope = envelope[:, n_fft // 2 : length - n_fft // 2]
            if bool(envelope.abs().min() < 1e-11):
                raise ValueError(f"ISTFT window overlap-add below 1e-11 ({num_frames} frames)")
            self._envelopes[key] = envelope
        return envelope
