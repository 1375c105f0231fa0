"""The Thinker's text tokenizer and the duplex special tokens resolved from it.

Special-token ids differ between tokenizers (the tiny one and the real Qwen-family one), so
they are always looked up by their string in the loaded tokenizer, never written as numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from tokenizers import Tokenizer

from backends.checkpoint.bpe_files import MERGES_FILE, VOCAB_FILE, has_bpe_files, tokenizer_from_bpe_files

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus what tokenizer_config.json adds: the EOS token and the
    ids the official duplex decoder never emits (`bad_token_ids`)."""

    def __init__(self, backend: Tokenizer, eos_token: str | None,
                 bad_token_ids: tuple[int, ...] = ()) -> None:
        self._backend = backend
        self.eos_token = eos_token
        self.eos_token_id = None if eos_token is None else backend.token_to_id(eos_token)
        self.bad_token_ids = bad_token_ids

    @classmethod
    def from_dir(cls, path: Path) -> TextTokenizer:
        """Load `tokenizer.json`, or build the same tokenizer from vocab.json + merges.txt + the
        added tokens (what transformers does for a folder without tokenizer.json);
        tokenizer_config.json is optional."""
        path = Path(path)
        config = _read_config(path / TOKENIZER_CONFIG_FILE)
        if (path / TOKENIZER_FILE).is_file():
            backend = Tokenizer.from_file(str(path / TOKENIZER_FILE))
        elif has_bpe_files(path):
            backend = tokenizer_from_bpe_files(path, config)
        else:
            raise ValueError(f"missing tokenizer: neither {TOKENIZER_FILE} nor {VOCAB_FILE} + "
                             f"{MERGES_FILE} in {path}")
        return cls(backend, _eos_token(config), _bad_token_ids(config))

    @property
    def vocab_size(self) -> int:
        """Number of ids, added (special) tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        # No template tokens: the duplex prompt builder places every special token itself.
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)


def _read_config(config_file: Path) -> dict[str, Any]:
    if not config_file.is_file():
        return {}
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON: {err}") from err
    return data if isinstance(data, dict) else {}


def _bad_token_ids(config: dict[str, Any]) -> tuple[int, ...]:
    ids = config.get("bad_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{TOKENIZER_CONFIG_FILE}: 'bad_token_ids' must be a list of ids")
    return tuple(ids)


def _eos_token(config: dict[str, Any]) -> str | None:
    eos: Any = config.get("eos_token")
    # transformers writes a special token either as its string or as an AddedToken dict.
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _token(text: str, required: bool) -> Any:
    """Field spec of one special token: its string and whether the runtime needs it."""
    meta = {"token": text, "required": required}
    if required:
        return field(metadata=meta)
    return field(default=None, metadata=meta)


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """Ids of the duplex protocol tokens; the first ten are required to serve duplex."""

    unit: int = _token("<unit>", True)  # opens a 1 s input unit; scheduler placeholder id
    unit_end: int = _token("</unit>", True)  # closes the previous unit; prompt pad id
    listen: int = _token("<|listen|>", True)  # unit decision: keep listening
    speak: int = _token("<|speak|>", True)  # unit decision: speak
    tts_bos: int = _token("<|tts_bos|>", True)
    tts_eos: int = _token("<|tts_eos|>", True)
    tts_pad: int = _token("<|tts_pad|>", True)  # never sampled in duplex
    chunk_eos: int = _token("<|chunk_eos|>", True)
    chunk_tts_eos: int = _token("<|chunk_tts_eos|>", True)
    turn_eos: int = _token("<|turn_eos|>", True)  # ends the turn, not the unit
    audio: int | None = _token("<|audio|>", False)  # ledger id of audio-embedding rows
    im_start: int | None = _token("<|im_start|>", False)
    im_end: int | None = _token("<|im_end|>", False)
    audio_start: int | None = _token("<|audio_start|>", False)
    audio_end: int | None = _token("<|audio_end|>", False)

    @classmethod
    def token_strings(cls) -> dict[str, str]:
        """Field name -> token string, in declaration order."""
        return {f.name: f.metadata["token"] for f in fields(cls)}

    @classmethod
    def resolve(cls, tokenizer: TextTokenizer) -> SpecialTokens:
        """Look every token up by string; raise ValueError listing the required ones missing."""
        ids: dict[str, int | None] = {}
        missing: list[str] = []
        for f in fields(cls):
            token_id = tokenizer.token_to_id(f.metadata["token"])
            if token_id is None and f.name == "listen":
                # Upstream falls back to EOS when a tokenizer predates the listen token.
                token_id = tokenizer.eos_token_id
            if token_id is None and f.metadata["required"]:
                missing.append(f.metadata["token"])
            ids[f.name] = token_id
        if missing:
            raise ValueError(f"tokenizer lacks required special tokens: {', '.join(missing)}")
        return cls(**ids)

    @property
    def chunk_terminators(self) -> frozenset[int]:
        """Tokens that end one unit's generation."""
        return frozenset((self.listen, self.chunk_eos, self.chunk_tts_eos))

    @property
    def turn_terminators(self) -> frozenset[int]:
        return frozenset((self.turn_eos,))
