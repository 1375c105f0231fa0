"""MiniCPM-o 4.5 `config.json` as validated dataclasses.

Field names are the HF keys. The Thinker backbone (Qwen3) lives at the top level of the file,
the audio encoder under `audio_config` and the Talker under `tts_config`. A key the official
config classes default (`MiniCPMOConfig` over transformers' `Qwen3Config`, `WhisperConfig` for
`audio_config`, `MiniCPMTTSConfig` for `tts_config`) may be absent and takes that default here;
a mistyped key raises ValueError naming its JSON path. `version` is optional too: the official
config class writes none, and a file that declares one must declare 4.5.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

from backends.checkpoint.json_section import JsonSection

SUPPORTED_VERSION = "4.5"
CONFIG_FILE = "config.json"
# transformers 4.51 Qwen3Config's defaults (MiniCPMOConfig passes the top level to it)
QWEN3_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10_000.0,
})
# WhisperConfig's defaults for the keys the encoder uses (`audio_config`)
WHISPER_DEFAULTS: Mapping[str, int] = MappingProxyType({
    "d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
    "num_mel_bins": 80, "max_source_positions": 1500,
})
# MiniCPMTTSConfig's defaults (`tts_config`); the Talker's Llama keeps LlamaConfig's eps/theta
TTS_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "llm_dim": 2560, "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
    "num_hidden_layers": 20, "num_key_value_heads": 12, "max_position_embeddings": 4096,
    "num_audio_tokens": 4097, "num_text_tokens": 21178, "num_vq": 1,
    "audio_bos_token_id": 21132, "text_eos_token_id": 21133,
    "normalize_projected_hidden": False, "attention_type": "sliding_recompute", "window_size": 2,
})


def _require_positive(obj: object, prefix: str, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"config.json: '{prefix}{name}' must be positive, got {value!r}")


def _require_divisible(prefix: str, num: tuple[str, int], den: tuple[str, int]) -> None:
    if num[1] % den[1]:
        raise ValueError(
            f"config.json: '{prefix}{num[0]}' ({num[1]}) must be a multiple of "
            f"'{prefix}{den[0]}' ({den[1]})"
        )


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """Thinker language backbone (Qwen3), read from the top level of config.json."""

    SECTION: ClassVar[str] = ""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    attention_bias: bool = False  # false selects Qwen3 (true would be the Qwen2 backbone)
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        _require_positive(self, self.SECTION, (
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size",
            "max_position_embeddings",
        ))
        _require_divisible(self.SECTION, ("num_attention_heads", self.num_attention_heads),
                           ("num_key_value_heads", self.num_key_value_heads))

    @classmethod
    def from_section(cls, s: JsonSection) -> LlmConfig:
        d = QWEN3_DEFAULTS
        heads = s.get("num_attention_heads", int, d["num_attention_heads"])
        return cls(
            hidden_size=s.get("hidden_size", int, d["hidden_size"]),
            num_hidden_layers=s.get("num_hidden_layers", int, d["num_hidden_layers"]),
            num_attention_heads=heads,
            # Qwen3Config: an explicit null means "as many KV heads as query heads"
            num_key_value_heads=s.get_or_null("num_key_value_heads", int,
                                              d["num_key_value_heads"], heads),
            head_dim=s.get("head_dim", int, d["head_dim"]),
            intermediate_size=s.get("intermediate_size", int, d["intermediate_size"]),
            rms_norm_eps=s.get("rms_norm_eps", float, d["rms_norm_eps"]),
            rope_theta=_rope_theta(s),
            vocab_size=s.get("vocab_size", int, d["vocab_size"]),
            max_position_embeddings=s.get("max_position_embeddings", int,
                                          d["max_position_embeddings"]),
            attention_bias=s.get("attention_bias", bool, False),
            tie_word_embeddings=s.get("tie_word_embeddings", bool, False),
        )


def _rope_theta(s: JsonSection) -> float:
    # transformers >= 5 writes `rope_parameters.rope_theta`; released checkpoints have `rope_theta`.
    if "rope_theta" in s.data or "rope_parameters" not in s.data:
        return s.get("rope_theta", float, QWEN3_DEFAULTS["rope_theta"])
    return s.section("rope_parameters").get("rope_theta", float)


@dataclass(frozen=True, slots=True)
class AudioConfig:
    """Whisper audio encoder (`apm.*`), read from `audio_config`."""

    SECTION: ClassVar[str] = "audio_config."

    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int = 1500  # 30 s of 50 Hz encoder frames

    def __post_init__(self) -> None:
        _require_positive(self, self.SECTION, (
            "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "num_mel_bins", "max_source_positions",
        ))
        _require_divisible(self.SECTION, ("d_model", self.d_model),
                           ("encoder_attention_heads", self.encoder_attention_heads))

    @property
    def projector_in_dim(self) -> int:
        """Input width of `audio_projection_layer` (upstream derives it from the ffn width)."""
        return self.encoder_ffn_dim // 4

    @classmethod
    def from_section(cls, s: JsonSection) -> AudioConfig:
        return cls(**{name: s.get(name, int, default) for name, default in WHISPER_DEFAULTS.items()})


@dataclass(frozen=True, slots=True)
class TtsConfig:
    """Talker (`tts.*`): Llama backbone plus codec tables, read from `tts_config`."""

    SECTION: ClassVar[str] = "tts_config."

    llm_dim: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    num_audio_tokens: int
    num_text_tokens: int
    audio_bos_token_id: int
    text_eos_token_id: int
    max_position_embeddings: int = 4096
    num_vq: int = 1
    # Read at the official default; the duplex Talker condition normalises whatever it says
    # (the official duplex path does), so serving never branches on it.
    normalize_projected_hidden: bool = False
    attention_type: str = "sliding_recompute"
    window_size: int = 2
    rms_norm_eps: float = 1e-6  # not in tts_config upstream: the Llama backbone's built-in value
    rope_theta: float = 10_000.0  # likewise LlamaConfig's default, never overridden upstream

    def __post_init__(self) -> None:
        _require_positive(self, self.SECTION, (
            "llm_dim", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_hidden_layers", "num_key_value_heads", "num_audio_tokens", "num_text_tokens",
            "max_position_embeddings", "window_size", "rms_norm_eps", "rope_theta",
        ))
        _require_divisible(self.SECTION, ("hidden_size", self.hidden_size),
                           ("num_attention_heads", self.num_attention_heads))
        _require_divisible(self.SECTION, ("num_attention_heads", self.num_attention_heads),
                           ("num_key_value_heads", self.num_key_value_heads))
        if self.num_vq != 1:
            raise ValueError(f"config.json: 'tts_config.num_vq' must be 1, got {self.num_vq}")
        if self.num_audio_tokens < 2:
            raise ValueError("config.json: 'tts_config.num_audio_tokens' must be >= 2 "
                             f"(speech codes plus EOS), got {self.num_audio_tokens}")
        for name in ("audio_bos_token_id", "text_eos_token_id"):
            if not 0 <= getattr(self, name) < self.num_text_tokens:
                raise ValueError(f"config.json: 'tts_config.{name}' ({getattr(self, name)}) must "
                                 f"index emb_text (num_text_tokens {self.num_text_tokens})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_code(self) -> int:
        """Codec EOS id: the last row of `emb_code`/`head_code`."""
        return self.num_audio_tokens - 1

    @classmethod
    def from_section(cls, s: JsonSection) -> TtsConfig:
        d = TTS_DEFAULTS
        sizes = {name: s.get(name, int, d[name]) for name in (
            "llm_dim", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_hidden_layers", "num_key_value_heads", "num_audio_tokens", "num_text_tokens",
            "audio_bos_token_id", "text_eos_token_id", "max_position_embeddings", "num_vq",
            "window_size",
        )}
        return cls(
            **sizes,
            normalize_projected_hidden=s.get("normalize_projected_hidden", bool,
                                             d["normalize_projected_hidden"]),
            attention_type=s.get("attention_type", str, d["attention_type"]),
            rms_norm_eps=s.get("rms_norm_eps", float, 1e-6),
            rope_theta=s.get("rope_theta", float, 10_000.0),
        )


@dataclass(frozen=True, slots=True)
class MiniCPMOConfig:
    """The whole config.json; `raw` keeps every key, including the ones not modelled here."""

    version: str
    llm: LlmConfig
    audio: AudioConfig
    audio_pool_step: int
    audio_chunk_length: float  # seconds per encoder attention chunk in chat mode
    tts: TtsConfig
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_version(self.version)
        _require_positive(self, "", ("audio_pool_step", "audio_chunk_length"))
        if self.tts.llm_dim != self.llm.hidden_size:
            raise ValueError(
                f"config.json: 'tts_config.llm_dim' ({self.tts.llm_dim}) must equal "
                f"'hidden_size' ({self.llm.hidden_size}): the Talker projects Thinker hidden states"
            )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> MiniCPMOConfig:
        top = JsonSection(raw)
        # The version gates everything else: a 2.6 config fails here, not on some later key.
        version = _version_string(top)
        _check_version(version)
        return cls(
            version=version,
            llm=LlmConfig.from_section(top),
            audio=AudioConfig.from_section(top.optional_section("audio_config")),
            audio_pool_step=top.get("audio_pool_step", int, 5),
            audio_chunk_length=top.get("audio_chunk_length", float, 1.0),
            tts=TtsConfig.from_section(top.optional_section("tts_config")),
            raw=dict(raw),
        )

    @classmethod
    def from_file(cls, path: Path) -> MiniCPMOConfig:
        """Parse `path` (a config.json, or a directory holding one)."""
        path = Path(path)
        file = path / CONFIG_FILE if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"missing {CONFIG_FILE}: {file}")
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{file} is not valid JSON: {err}") from err
        if not isinstance(raw, dict):
            raise ValueError(f"{file} must hold a JSON object")
        return cls.from_dict(raw)


def _version_string(top: JsonSection) -> str:
    if "version" not in top.data:
        return SUPPORTED_VERSION  # what the official 4.5 config class writes: no version key
    value = top.data["version"]
    # MiniCPM configs have written the version both as a JSON number and as a string.
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"config.json: key 'version' must be a string or number, got {value!r}")


def _check_version(version: str) -> None:
    if version != SUPPORTED_VERSION:
        raise ValueError(f"config.json: unsupported MiniCPM-o version {version!r}; only "
                         f"{SUPPORTED_VERSION!r} is supported (2.6 and others differ in layout)")
