"""Token2wav dimensions: the flow (codes -> mel: encoder + CFM with a DiT estimator) and the
HiFT vocoder (mel -> 24 kHz audio).

Defaults are the real Step-Audio2 token2wav sizes (docs/model_facts.md#code2wav-token2wav);
`tiny()` gives the CPU test/CI profile. Field names follow flow.yaml / HiFTGenerator arguments
so the asset file reads like the real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _require_positive(owner: str, values: dict[str, int | float]) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{owner}.{name} must be positive, got {value!r}")


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """`UpsampleConformerEncoderV2` (rel-pos Conformer, 3-code look-ahead, x2 up-sampling)."""

    output_size: int = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6  # token-rate Conformer layers
    num_up_blocks: int = 4  # mel-rate Conformer layers after the x2 up-sampling
    pre_lookahead_len: int = 3  # right-context codes each window consumes
    up_stride: int = 2  # mel frames per code
    max_positions: int = 5000  # the rel-pos table covers distances up to this - 1

    def __post_init__(self) -> None:
        _require_positive("EncoderConfig", {
            "output_size": self.output_size, "attention_heads": self.attention_heads,
            "linear_units": self.linear_units, "num_blocks": self.num_blocks,
            "num_up_blocks": self.num_up_blocks, "pre_lookahead_len": self.pre_lookahead_len,
            "up_stride": self.up_stride, "max_positions": self.max_positions,
        })
        if self.output_size % self.attention_heads or self.output_size % 2:
            raise ValueError(
                f"EncoderConfig.output_size={self.output_size} must be even and a multiple of "
                f"attention_heads={self.attention_heads}"
            )


@dataclass(frozen=True, slots=True)
class DiTConfig:
    """The CFM estimator `DiT` (adaLN-Zero blocks with a causal conv, no positional code)."""

    in_channels: int = 320  # x_t | mu | speaker | cond, 80 each
    out_channels: int = 80
    mlp_ratio: float = 4.0
    depth: int = 16
    num_heads: int = 8
    head_dim: int = 64
    hidden_size: int = 512

    def __post_init__(self) -> None:
        _require_positive("DiTConfig", {
            "in_channels": self.in_channels, "out_channels": self.out_channels,
            "mlp_ratio": self.mlp_ratio, "depth": self.depth, "num_heads": self.num_heads,
            "head_dim": self.head_dim, "hidden_size": self.hidden_size,
        })
        if self.in_channels != 4 * self.out_channels:
            raise ValueError(
                f"DiTConfig.in_channels={self.in_channels} must be 4 x out_channels="
                f"{self.out_channels} (x, mu, speaker and cond are concatenated)"
            )

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)


@dataclass(frozen=True, slots=True)
class CFMConfig:
    """`CausalConditionalCFM`: Euler steps on the cosine grid with classifier-free guidance."""

    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10  # HF's Token2wav default; not in flow.yaml
    noise_frames: int = 50 * 600  # the fixed noise stream covers 600 s of mel frames
    estimator: DiTConfig = field(default_factory=DiTConfig)

    def __post_init__(self) -> None:
        _require_positive("CFMConfig", {
            "inference_cfg_rate": self.inference_cfg_rate, "n_timesteps": self.n_timesteps,
            "noise_frames": self.noise_frames,
        })


@dataclass(frozen=True, slots=True)
class FlowConfig:
    vocab_size: int = 6561  # speech codes 0..6560; the Talker EOS 6561 must never reach here
    input_size: int = 512  # code embedding width (= the encoder width, see __post_init__)
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192  # campplus speaker embedding
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: CFMConfig = field(default_factory=CFMConfig)

    def __post_init__(self) -> None:
        _require_positive("FlowConfig", {
            "vocab_size": self.vocab_size, "input_size": self.input_size,
            "output_size": self.output_size, "spk_embed_dim": self.spk_embed_dim,
        })
        # the reference builds `up_embed` with input_size but feeds it encoder features
        if self.input_size != self.encoder.output_size:
            raise ValueError(
                f"FlowConfig.input_size={self.input_size} must equal encoder.output_size="
                f"{self.encoder.output_size}"
            )
        if self.decoder.estimator.out_channels != self.output_size:
            raise ValueError(
                f"estimator out_channels={self.decoder.estimator.out_channels} != "
                f"output_size={self.output_size}"
            )


@dataclass(frozen=True, slots=True)
class HiFTConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1  # sine amplitude of the source excitation
    nsf_sigma: float = 0.003  # noise amplitude on voiced samples (unvoiced: nsf_alpha / 3)
    nsf_voiced_threshold: float = 10.0  # Hz; below it the sines are gated off
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512

    def __post_init__(self) -> None:
        _require_positive("HiFTConfig", {
            "in_channels": self.in_channels, "base_channels": self.base_channels,
            "sampling_rate": self.sampling_rate, "istft_n_fft": self.istft_n_fft,
            "istft_hop_len": self.istft_hop_len, "f0_cond_channels": self.f0_cond_channels,
        })
        num_stages = len(self.upsample_rates)
        if len(self.upsample_kernel_sizes) != num_stages:
            raise ValueError(
                f"upsample_kernel_sizes {self.upsample_kernel_sizes} does not match "
                f"upsample_rates {self.upsample_rates}"
            )
        if len(self.source_resblock_kernel_sizes) != num_stages or len(
            self.source_resblock_dilation_sizes
        ) != num_stages:
            raise ValueError(f"source resblocks must list one entry per stage ({num_stages})")
        if len(self.resblock_dilation_sizes) != len(self.resblock_kernel_sizes):
            raise ValueError("resblock_dilation_sizes must list one entry per kernel size")
        if self.base_channels % (2**num_stages):
            raise ValueError(f"base_channels={self.base_channels} must divide by 2^{num_stages}")

    @property
    def hop_samples(self) -> int:
        """Output samples per mel frame (480 at 24 kHz / 50 Hz)."""
        return math.prod(self.upsample_rates) * self.istft_hop_len


@dataclass(frozen=True, slots=True)
class Token2WavConfig:
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)
    mel_cache_frames: int = 8  # mel frames re-fed to the HiFT; also the cross-fade span
    # attention caches keep the prompt span plus this many frames (the reference's `+ 100`)
    cache_keep_frames: int = 100
    prompt_seconds: float = 6.0  # the voice prompt is cut or zero-padded to this length

    def __post_init__(self) -> None:
        _require_positive("Token2WavConfig", {
            "mel_cache_frames": self.mel_cache_frames,
            "cache_keep_frames": self.cache_keep_frames, "prompt_seconds": self.prompt_seconds,
        })
        if self.flow.output_size != self.hift.in_channels:
            raise ValueError(
                f"flow.output_size={self.flow.output_size} != hift.in_channels="
                f"{self.hift.in_channels}"
            )

    @property
    def overlap_samples(self) -> int:
        """Samples held back per non-final window for the Hamming cross-fade (3840)."""
        return self.mel_cache_frames * self.hift.hop_samples

    @classmethod
    def tiny(cls) -> Token2WavConfig:
        """The CPU profile: the real structure, step count, rates and caches; widths small
        enough that one steady window runs in a few tens of milliseconds on one core."""
        encoder = EncoderConfig(
            output_size=32, attention_heads=2, linear_units=64, num_blocks=2, num_up_blocks=2
        )
        estimator = DiTConfig(mlp_ratio=2.0, depth=2, num_heads=2, head_dim=16, hidden_size=32)
        flow = FlowConfig(input_size=32, encoder=encoder, decoder=CFMConfig(estimator=estimator))
        hift = HiFTConfig(
            base_channels=16,
            resblock_kernel_sizes=(3,),
            resblock_dilation_sizes=((1, 3, 5),),
            f0_cond_channels=16,
        )
        return cls(flow=flow, hift=hift)
