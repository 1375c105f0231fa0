"""The parity reference: stepaudio2-minicpmo 0.1.1's model modules, built at our tiny widths.

The reference's package `__init__` pulls torchaudio, s3tokenizer, onnxruntime, transformers and
hyperpyyaml; its model modules need only torch, numpy, scipy and einops
(docs/model_facts.md#code2wav-token2wav). So the package is registered as an empty namespace over
its installed folder and `onnxruntime` (imported but unused by `flow_matching`) is stubbed while
the modules load.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass

import torch

from backends.models.token2wav import Token2Wav, Token2WavConfig
from backends.models.weight_norm import fold_weight_norm_keys

REFERENCE_PACKAGE = "stepaudio2"
INSTALL_HINT = ("the parity reference stepaudio2-minicpmo 0.1.1 is not installed: "
                "pip install --no-deps stepaudio2-minicpmo==0.1.1 einops scipy")


def missing_reason() -> str | None:
    """Why the reference cannot load here, or None."""
    spec = importlib.util.find_spec(REFERENCE_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return INSTALL_HINT
    for needed in ("einops", "scipy"):
        if importlib.util.find_spec(needed) is None:
            return f"{needed} is missing; {INSTALL_HINT}"
    return None


@dataclass(frozen=True, slots=True)
class Reference:
    """The reference's model modules."""

    flow: types.ModuleType  # stepaudio2.cosyvoice2.flow.flow
    cfm: types.ModuleType  # stepaudio2.cosyvoice2.flow.flow_matching
    dit: types.ModuleType  # stepaudio2.cosyvoice2.flow.decoder_dit
    encoder: types.ModuleType  # stepaudio2.cosyvoice2.transformer.upsample_encoder_v2
    hift: types.ModuleType  # stepaudio2.flashcosyvoice.modules.hifigan


def load_reference() -> Reference:
    package_path = list(importlib.util.find_spec(REFERENCE_PACKAGE).submodule_search_locations)
    if REFERENCE_PACKAGE not in sys.modules:
        package = types.ModuleType(REFERENCE_PACKAGE)
        package.__path__ = package_path
        package.__spec__ = importlib.machinery.ModuleSpec(REFERENCE_PACKAGE, None, is_package=True)
        sys.modules[REFERENCE_PACKAGE] = package
    import torch._dynamo  # the encoder module rewrites two dynamo settings at import

    saved = (torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit)
    stub = types.ModuleType("onnxruntime")
    stub.__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)
    had_onnxruntime = "onnxruntime" in sys.modules
    sys.modules.setdefault("onnxruntime", stub)
    try:
        modules = [importlib.import_module(f"{REFERENCE_PACKAGE}.{name}") for name in (
            "cosyvoice2.flow.flow", "cosyvoice2.flow.flow_matching", "cosyvoice2.flow.decoder_dit",
            "cosyvoice2.transformer.upsample_encoder_v2", "flashcosyvoice.modules.hifigan",
        )]
    finally:
        if not had_onnxruntime:
            sys.modules.pop("onnxruntime", None)
        torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit = saved
    return Reference(*modules)


@dataclass(frozen=True, slots=True)
class ReferencePair:
    """A reference flow + HiFT with random weights and our Token2Wav loaded from them."""

    ref_flow: torch.nn.Module  # stepaudio2 CausalMaskedDiffWithXvec, tiny dims, eval
    ref_hift: torch.nn.Module  # stepaudio2 HiFTGenerator, tiny dims, eval
    ours: Token2Wav


def build_pair(reference: Reference) -> ReferencePair:
    config = Token2WavConfig.tiny()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        ref_flow = _reference_flow(reference, config)
        ref_hift = _reference_hift(reference, config)
    ours = Token2Wav(config)
    ours.flow.load_state_dict(ref_flow.state_dict(), strict=True)
    ours.flow.decoder.rand_noise.copy_(ref_flow.decoder.rand_noise)
    hift_state = fold_weight_norm_keys(dict(ref_hift.state_dict()))
    ours.hift.load_state_dict(hift_state, strict=True)
    return ReferencePair(ref_flow.eval(), ref_hift.eval(), ours.eval())


def _reference_flow(reference: Reference, config: Token2WavConfig) -> torch.nn.Module:
    enc, est = config.flow.encoder, config.flow.decoder.estimator
    encoder = reference.encoder.UpsampleConformerEncoderV2(
        input_size=config.flow.input_size, output_size=enc.output_size,
        pre_lookahead_len=enc.pre_lookahead_len, num_blocks=enc.num_blocks,
        num_up_blocks=enc.num_up_blocks, up_stride=enc.up_stride, up_scale_factor=enc.up_stride,
        attention_heads=enc.attention_heads, linear_units=enc.linear_units,
    )
    dit = reference.dit.DiT(in_channels=est.in_channels, out_channels=est.out_channels,
                            mlp_ratio=est.mlp_ratio, depth=est.depth, num_heads=est.num_heads,
                            head_dim=est.head_dim, hidden_size=est.hidden_size)
    _randomise_zeroed(dit)
    # the reference's scratch buffers assume 16 blocks of 8 x 64 heads (and 2 GB for the CFM's)
    max_frames = 1000
    dit.att_cache_buffer = torch.zeros(est.depth, 2, est.num_heads, max_frames, 2 * est.head_dim)
    dit.cnn_cache_buffer = torch.zeros(est.depth, 2, 2 * est.hidden_size, 2)
    with torch.device("meta"):
        cfm = reference.cfm.CausalConditionalCFM(dit, inference_cfg_rate=0.7)
    steps = config.flow.decoder.n_timesteps
    cfm.rand_noise = torch.randn(1, est.out_channels, config.flow.decoder.noise_frames)
    cfm.att_cache_buffer = torch.zeros(steps, *dit.att_cache_buffer.shape)
    cfm.cnn_cache_buffer = torch.zeros(steps, *dit.cnn_cache_buffer.shape)
    return reference.flow.CausalMaskedDiffWithXvec(
        input_size=config.flow.input_size, output_size=config.flow.output_size,
        spk_embed_dim=config.flow.spk_embed_dim, vocab_size=config.flow.vocab_size,
        encoder=encoder, decoder=cfm,
    )


@torch.no_grad()
def _randomise_zeroed(dit: torch.nn.Module) -> None:
    """The reference zero-initialises adaLN and the output layer (its DiT would output 0)."""
    for name, param in dit.named_parameters():
        if "adaLN_modulation" in name or name.startswith("final_layer.linear"):
            param.normal_(0.0, 0.05)


def _reference_hift(reference: Reference, config: Token2WavConfig) -> torch.nn.Module:
    hift = config.hift
    f0 = reference.hift.ConvRNNF0Predictor(in_channels=hift.in_channels,
                                           cond_channels=hift.f0_cond_channels)
    generator = reference.hift.HiFTGenerator(
        base_channels=hift.base_channels,
        resblock_kernel_sizes=list(hift.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in hift.resblock_dilation_sizes],
        f0_predictor=f0,
    )
    with torch.no_grad():  # a voiced pitch, so the harmonic source is compared too
        f0.classifier.bias.fill_(120.0)
        f0.classifier.weight.mul_(20.0)
    return generator


def reference_noise(seed: int, num_frames: int, hop: int = 480, num_sines: int = 9) -> torch.Tensor:
    """The source noise the reference HiFT draws after `torch.manual_seed(seed)`:
    [1, hop num_frames, num_sines] float32.

    Its draws are rand(B, 9) (the initial phase), then randn_like of the sine tensor, which is
    laid out [B, 9, L] in memory (it comes from a transposed interpolation); CPU normal
    sampling fills memory in order, so the layout must be reproduced, not just the shape."""
    torch.manual_seed(seed)
    torch.rand(1, num_sines)
    return torch.randn_like(torch.empty(1, num_sines, hop * num_frames).transpose(1, 2))


def build_full_size_reference(reference: Reference) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference flow (flow.yaml's values, docs/model_facts.md#code2wav-token2wav) and
    `HiFTGenerator()` with its defaults; call under `torch.device("meta")` to allocate nothing."""
    encoder = reference.encoder.UpsampleConformerEncoderV2(
        input_size=512, output_size=512, pre_lookahead_len=3, num_blocks=6, num_up_blocks=4,
        up_stride=2, up_scale_factor=2, attention_heads=8, linear_units=2048,
    )
    dit = reference.dit.DiT(in_channels=320, out_channels=80, mlp_ratio=4.0, depth=16,
                            num_heads=8, head_dim=64, hidden_size=512)
    cfm = reference.cfm.CausalConditionalCFM(dit, inference_cfg_rate=0.7)
    flow = reference.flow.CausalMaskedDiffWithXvec(
        input_size=512, output_size=80, spk_embed_dim=192, vocab_size=6561,
        encoder=encoder, decoder=cfm,
    )
    return flow, reference.hift.HiFTGenerator()
