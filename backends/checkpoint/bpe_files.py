"""The fast tokenizer of a checkpoint folder that has no `tokenizer.json`.

The official MiniCPM-o 4.5 folder may carry only the byte-level BPE files (`vocab.json`,
`merges.txt`) and `tokenizer_config.json` with its `added_tokens_decoder`; transformers then
builds the fast tokenizer itself (Qwen2's slow-to-fast conversion). This module builds the same
`tokenizers.Tokenizer`: NFC normalisation, Qwen2's split pattern then byte-level mapping, the
BPE model without unknown token, and the added tokens in id order with their flags, each
checked to land on the id the folder declares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
ADDED_TOKENS_FILE = "added_tokens.json"
# transformers' Qwen2 pre-tokenisation pattern (models/qwen2/tokenization_qwen2.py)
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
               r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def has_bpe_files(path: Path) -> bool:
    return (path / VOCAB_FILE).is_file() and (path / MERGES_FILE).is_file()


def tokenizer_from_bpe_files(path: Path, tokenizer_config: dict[str, Any]) -> Tokenizer:
    """The fast tokenizer transformers builds from `path`'s BPE files and added tokens."""
    vocab = json.loads((path / VOCAB_FILE).read_text(encoding="utf-8"))
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=_merges(path / MERGES_FILE), dropout=None,
                              unk_token=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    add_prefix_space = bool(tokenizer_config.get("add_prefix_space", False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    for token_id, token in sorted(_added_tokens(path, tokenizer_config).items()):
        _add(tokenizer, token_id, token)
    return tokenizer


def _merges(file: Path) -> list[tuple[str, str]]:
    merges = []
    for i, line in enumerate(file.read_text(encoding="utf-8").splitlines()):
        line = line.strip()
        if (i == 0 and line.startswith("#version:")) or not line:
            continue
        first, second = line.split()
        merges.append((first, second))
    return merges


def _added_tokens(path: Path, tokenizer_config: dict[str, Any]) -> dict[int, AddedToken]:
    """id -> token from `added_tokens_decoder`, else (older folders) `added_tokens.json`."""
    decoder = tokenizer_config.get("added_tokens_decoder")
    if isinstance(decoder, dict) and decoder:
        return {int(i): _added_token(spec) for i, spec in decoder.items()}
    file = path / ADDED_TOKENS_FILE
    if not file.is_file():
        return {}
    special = _special_strings(tokenizer_config)
    return {int(i): AddedToken(text, special=text in special, normalized=text not in special)
            for text, i in json.loads(file.read_text(encoding="utf-8")).items()}


def _added_token(spec: dict[str, Any]) -> AddedToken:
    return AddedToken(spec["content"], single_word=spec.get("single_word", False),
                      lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                      normalized=spec.get("normalized", True), special=spec.get("special", False))


def _special_strings(tokenizer_config: dict[str, Any]) -> set[str]:
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    values = [tokenizer_config.get(n) for n in names]
    values += tokenizer_config.get("additional_special_tokens") or []
    return {v["content"] if isinstance(v, dict) else v for v in values if v}


def _add(tokenizer: Tokenizer, token_id: int, token: AddedToken) -> None:
    existing = tokenizer.token_to_id(token.content)
    if existing is None:
        tokenizer.add_tokens([token])
        existing = tokenizer.token_to_id(token.content)
    if existing != token_id:
        raise ValueError(f"tokenizer: added token {token.content!r} is declared with id "
                         f"{token_id} but lands on {existing} (vocab.json and the added tokens "
                         f"do not fit together)")
