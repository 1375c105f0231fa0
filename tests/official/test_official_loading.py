"""Loading what the official MiniCPM-o 4.5 classes write.

Strategy: the official `save_pretrained` output (config.json without `version`, fp32 or bf16
shards, the real tokenizer files without tokenizer.json) must load with `load_checkpoint`; the
tokenizer we build from vocab.json + merges.txt + the added tokens must give the official
tokenizer's ids, decodings, length and `bad_token_ids`; a directory without the assets the
official writer leaves out must fail at load with one message naming them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from backends.checkpoint import CheckpointError, load_checkpoint
from backends.checkpoint.full_random import full_random_checkpoint
from backends.checkpoint.tokenizer import TOKENIZER_FILE, TextTokenizer
from backends.models.talker import TalkerConfig, TalkerModel
from backends.thinker.model import ThinkerModel
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


def test_full_random_holds_the_released_tensors(official: OfficialOutputs) -> None:
    """Every tensor the full-random profile allocates has the shape the official classes give
    it at the released sizes; of the official tensors, only the unused `tts.projector_spk`
    is not held (the weight-normalised head is held folded, as from any checkpoint)."""
    released = official.values("released_shapes")["shapes"]
    ckpt = full_random_checkpoint()
    thinker = ThinkerModel.from_full_random(ckpt, torch.device("meta"), torch.bfloat16)
    with torch.device("meta"):
        talker = TalkerModel(TalkerConfig.from_dict(ckpt.config.raw["tts_config"]))
    ours = {**{f"llm.{k}": v for k, v in thinker.llm.state_dict().items()},
            **thinker.audio_encoder.state_dict(),
            **{f"tts.{k}": v for k, v in talker.state_dict().items()}}
    folded = {k.replace(".parametrizations.weight.original1", ".weight"): v
              for k, v in released.items() if not k.endswith(".original0")}
    assert {k: list(v.shape) for k, v in ours.items()} == {k: v for k, v in folded.items()
                                                           if k in ours}
    assert sorted(set(folded) - set(ours)) == sorted(k for k in folded
                                                     if k.startswith("tts.projector_spk."))


def _tokenizer_copy(official: OfficialOutputs, tmp_path: Path) -> Path:
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json"):
        shutil.copyfile(official.checkpoint() / name, tmp_path / name)
    return tmp_path


def test_older_folders_list_added_tokens_in_added_tokens_json(official: OfficialOutputs,
                                                             tmp_path: Path) -> None:
    folder = _tokenizer_copy(official, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ref = official.values("tokenizer")
    ours = TextTokenizer.from_dir(folder)
    assert [ours.encode(text) for text in ref["texts"]] == ref["ids"]


def test_added_tokens_that_do_not_fit_the_vocabulary_are_named(official: OfficialOutputs,
                                                               tmp_path: Path) -> None:
    folder = _tokenizer_copy(official, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    decoder["151800"] = decoder.pop("151747")  # a gap: the token lands on 151747
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"declared with id 151800 but lands on 151747"):
        TextTokenizer.from_dir(folder)
    (folder / "merges.txt").unlink()
    with pytest.raises(ValueError, match=r"missing tokenizer: neither tokenizer.json nor "
                                         r"vocab.json \+ merges.txt"):
        TextTokenizer.from_dir(folder)
