"""The `assets/token2wav/` folder: write random-weight assets, load assets into a Token2Wav.

Files: `flow.yaml` (dimensions, in the real file's hyperpyyaml layout: `flow: !new:...` with
`encoder` and `decoder` (CFM with its `estimator` DiT) nodes), `flow.pt` (flow state dict, the
reference's key names) and `hift.pt` (HiFT state dict with the weight-normalised layers stored
as parametrization (g, v) pairs, like the reference file). The reader accepts any `!tag` (it
only reads values), so the real flow.yaml parses too; the `hift` node and the CFM's
`n_timesteps` are ours (the reference builds its HiFT in code with default arguments and
passes the step count at call time), and without them the real values are used. The voice
models `campplus.onnx` and `speech_tokenizer_v2_25hz.onnx` are optional together
(`voice_assets`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch
import yaml

from backends.models.token2wav.config import (
    CFMConfig,
    DiTConfig,
    EncoderConfig,
    FlowConfig,
    HiFTConfig,
    Token2WavConfig,
)
from backends.models.token2wav.token2wav import Token2Wav
from backends.models.token2wav.voice import VoicePrompt
from backends.models.token2wav.voice_assets import load_voice_encoder
from backends.models.weight_norm import fold_weight_norm_keys, split_weight_norm

ASSET_SUBDIR = Path("assets") / "token2wav"
_FLOW_TARGET = "cosyvoice2.flow.flow.CausalMaskedDiffWithXvec"
_ENCODER_TARGET = "cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2"
_CFM_TARGET = "cosyvoice2.flow.flow_matching.CausalConditionalCFM"
_DIT_TARGET = "cosyvoice2.flow.decoder_dit.DiT"
_HIFT_TARGET = "cosyvoice2.hifigan.generator.HiFTGenerator"
_HIFT_PREFIX = "generator."  # some reference hift.pt files prefix every key with it
_POST_GAIN = 0.04  # random conv_post scale: log-magnitudes vary by well under +-1
_POST_LOG_MAGNITUDE = -1.0  # random conv_post bias: rms about 0.05, peaks well below the clip
_F0_HZ = 120.0  # random F0 around a voice's pitch, so the harmonic source is exercised
_F0_SPREAD = 20.0
_DIT_MODULATION_STD = 0.02  # keeps gates and shifts well below 1: velocities stay O(1)
_REF = re.compile(r"^<(\w+)>$")


@dataclasses.dataclass(frozen=True, slots=True)
class _New:
    """A `!new:<target>` mapping node for the YAML writer."""

    target: str
    fields: dict[str, Any]


def write_token2wav_assets(model_dir: Path, config: Token2WavConfig, seed: int) -> Path:
    """Write flow.yaml, flow.pt and hift.pt with seeded random weights under
    `model_dir/assets/token2wav/`; returns that folder."""
    out = Path(model_dir) / ASSET_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    model = random_token2wav(config, seed)
    (out / "flow.yaml").write_text(render_flow_yaml(config))
    torch.save(model.flow.state_dict(), out / "flow.pt")
    torch.save(weight_normed_state(model), out / "hift.pt")
    return out


def load_token2wav(assets_dir: Path, device: torch.device | str = "cpu") -> Token2Wav:
    """Build from `assets_dir/flow.yaml`, load flow.pt / hift.pt strictly (eval mode) and open
    the voice models (or take the stand-ins, see `voice_assets`)."""
    assets_dir = Path(assets_dir)
    config = read_flow_yaml(assets_dir / "flow.yaml")
    model = Token2Wav(config)
    model.voice_encoder = load_voice_encoder(assets_dir, device, config.flow.vocab_size,
                                             config.flow.spk_embed_dim)
    flow_state = torch.load(assets_dir / "flow.pt", map_location="cpu", weights_only=True)
    _load_strict(model.flow, flow_state, assets_dir / "flow.pt")
    hift_state = torch.load(assets_dir / "hift.pt", map_location="cpu", weights_only=True)
    hift_state = {k.removeprefix(_HIFT_PREFIX): v for k, v in hift_state.items()}
    _load_strict(model.hift, fold_weight_norm_keys(hift_state), assets_dir / "hift.pt")
    return model.to(device).eval()


def random_token2wav(config: Token2WavConfig, seed: int) -> Token2Wav:
    """A Token2Wav with seeded random weights (the process RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Token2Wav(config)
        _init_dit(model.flow.decoder.estimator)
        _init_hift(model.hift)
    return model.eval()


def random_voice_prompt(seed: int, num_codes: int = 50, mel_offset: float = -4.0) -> VoicePrompt:
    """A seeded random voice prompt (tests, benchmarks): `num_codes` codec ids, twice as many
    80-bin log-mel frames around `mel_offset`, a 192-d speaker embedding."""
    generator = torch.Generator().manual_seed(seed)
    return VoicePrompt(torch.randint(0, 6561, (num_codes,), generator=generator),
                       torch.randn(2 * num_codes, 80, generator=generator) + mel_offset,
                       torch.randn(192, generator=generator))


@torch.no_grad()
def _init_dit(dit: torch.nn.Module) -> None:
    """Small random adaLN and output layers: the reference zero-initialises them (a fresh DiT
    outputs exactly 0), which would make random-weight tests blind to the estimator."""
    for name, param in dit.named_parameters():
        if "adaLN_modulation" in name or name.startswith("final_layer.linear"):
            param.normal_(0.0, _DIT_MODULATION_STD)


@torch.no_grad()
def _init_hift(hift: torch.nn.Module) -> None:
    """Variance-preserving conv weights and zero biases, so random audio varies with the
    codes instead of collapsing to the biases; the post conv is scaled so that
    exp(log-magnitude) stays small and the output does not saturate at the audio limit; the F0
    head is biased to a voiced pitch (else every frame is unvoiced noise)."""
    for module in hift.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            weight = module.weight
            fan_in = weight.shape[1 if isinstance(module, torch.nn.Conv1d) else 0] * weight.shape[2]
            fan_in /= module.stride[0] if isinstance(module, torch.nn.ConvTranspose1d) else 1
            weight.normal_(0.0, fan_in**-0.5)
            module.bias.zero_()
    hift.conv_post.weight.mul_(_POST_GAIN)
    hift.conv_post.bias.fill_(_POST_LOG_MAGNITUDE)
    hift.f0_predictor.classifier.weight.mul_(_F0_SPREAD)
    hift.f0_predictor.classifier.bias.fill_(_F0_HZ)


def render_flow_yaml(config: Token2WavConfig) -> str:
    flow = dataclasses.asdict(config.flow)
    encoder = flow.pop("encoder")
    encoder["input_size"] = config.flow.input_size
    decoder = flow.pop("decoder")
    decoder["estimator"] = _New(_DIT_TARGET, decoder.pop("estimator"))
    flow["output_type"] = "mel"
    flow["encoder"] = _New(_ENCODER_TARGET, encoder)
    flow["decoder"] = _New(_CFM_TARGET, decoder)
    doc = {
        "flow": _New(_FLOW_TARGET, flow),
        "hift": _New(_HIFT_TARGET, _lists(dataclasses.asdict(config.hift))),
        "mel_cache_frames": config.mel_cache_frames,
    }
    header = "# token2wav dimensions (backends.models.token2wav); weights in flow.pt / hift.pt\n"
    return header + yaml.dump(doc, Dumper=_dumper(), sort_keys=False)


def read_flow_yaml(path: Path) -> Token2WavConfig:
    doc = yaml.load(Path(path).read_text(), Loader=_loader())
    if not isinstance(doc, dict) or not isinstance(doc.get("flow"), dict):
        raise ValueError(f"{path}: no `flow` mapping")
    flow = _resolved(doc["flow"], doc)
    decoder = _resolved(flow.get("decoder"), doc)
    estimator = _pick(DiTConfig, _resolved(decoder.get("estimator"), doc))
    flow_config = _pick(
        FlowConfig, flow,
        encoder=_pick(EncoderConfig, _resolved(flow.get("encoder"), doc)),
        decoder=_pick(CFMConfig, decoder, estimator=estimator),
    )
    hift = doc.get("hift") or {}
    return Token2WavConfig(
        flow=flow_config,
        hift=_pick(HiFTConfig, hift),
        mel_cache_frames=int(doc.get("mel_cache_frames", Token2WavConfig().mel_cache_frames)),
    )


def weight_normed_state(model: Token2Wav) -> dict[str, torch.Tensor]:
    """The HiFT state dict in hift.pt's spelling: each weight-normalised layer as (g, v)."""
    state = dict(model.hift.state_dict())
    for layer in model.hift.weight_norm_layers():
        g, v = split_weight_norm(state.pop(f"{layer}.weight"))
        state[f"{layer}.parametrizations.weight.original0"] = g
        state[f"{layer}.parametrizations.weight.original1"] = v
    return state


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{source}: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}")
    module.load_state_dict(state, strict=True)


def _pick(cls: type, mapping: dict[str, Any], **overrides: Any) -> Any:
    """Build `cls` from the keys of `mapping` it declares (the real yaml carries more)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: _tuples(v) for k, v in mapping.items() if k in names}
    return cls(**{**values, **overrides})


def _resolved(node: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """A mapping node with its `<name>` references resolved ({} when absent)."""
    return {k: _resolve(v, doc) for k, v in node.items()} if isinstance(node, dict) else {}


def _resolve(value: Any, doc: dict[str, Any]) -> Any:
    """Resolve a hyperpyyaml `<name>` reference to a top-level value."""
    match = _REF.match(value) if isinstance(value, str) else None
    return doc.get(match.group(1), value) if match else value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return [_lists(v) for v in value] if isinstance(value, (list, tuple)) else value


def _dumper() -> type[yaml.SafeDumper]:
    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(
        _New, lambda dumper, node: dumper.represent_mapping(f"!new:{node.target}", node.fields)
    )
    return Dumper


def _loader() -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", _construct_tagged)
    return Loader


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    """Any hyperpyyaml tag (`!new:`, `!ref`, `!name:`, ...) -> its plain value."""
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)
