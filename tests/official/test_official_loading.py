"""Loading what the official MiniCPM-o 4.5 classes write.

Strategy: the official `save_pretrained` output (config.json without `version`, fp32 or bf16
shards, the real tokenizer files without tokenizer.json) must load with `load_checkpoint`; the
tokenizer we build from vocab.json + merges.txt + the added tokens must give the official
tokenizer's ids, decodings, length and `bad_token_ids`; a directory without the assets the
official writer leaves out must fail at load with one message naming them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from backends.checkpoint import CheckpointError, load_checkpoint
from backends.checkpoint.tokenizer import TOKENIZER_FILE, TextTokenizer
from official_outputs import OfficialOutputs


def test_tokenizer_ids_equal_the_official(official: OfficialOutputs) -> None:
    ref = official.values("tokenizer")
    ckpt = official.checkpoint()
    assert not (ckpt / TOKENIZER_FILE).exists()  # built from the BPE files, as transformers does
    ours = TextTokenizer.from_dir(ckpt)
    assert ours.vocab_size == ref["len"]
    assert list(ours.bad_token_ids) == ref["bad_token_ids"]
    for text, ids, decoded, plain in zip(ref["texts"], ref["ids"], ref["decoded"],
                                         ref["decoded_skip_special"]):
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == decoded
        assert ours.decode(ids, skip_special_tokens=True) == plain


@pytest.mark.parametrize("stored", ["float32", "bfloat16"])
def test_official_checkpoints_load(official: OfficialOutputs, served: Callable[[str], Path],
                                   stored: str) -> None:
    raw = json.loads((official.checkpoint(stored) / "config.json").read_text())
    assert "version" not in raw and raw["tts_config"]["normalize_projected_hidden"] is False
    ckpt = load_checkpoint(served(stored))
    assert ckpt.config.version == "4.5"
    assert (ckpt.config.llm.vocab_size, ckpt.tokenizer.vocab_size) == (151748, 151748)
    assert ckpt.special_tokens.listen == ckpt.tokenizer.token_to_id("<|listen|>")
    dtypes = {t.dtype for t in ckpt.weights("llm.").values()}
    assert dtypes == {getattr(torch, stored)}


def test_a_checkpoint_without_assets_names_them(official: OfficialOutputs) -> None:
    with pytest.raises(CheckpointError, match=r"missing assets/HT_ref_audio\.wav, "
                                              r"assets/token2wav/flow\.yaml, .*hift\.pt") as err:
        load_checkpoint(official.checkpoint())
    assert str(err.value).count("missing") == 1
