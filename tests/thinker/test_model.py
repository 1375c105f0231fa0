"""ThinkerModel: assembly from the generated tiny checkpoint (real key layout).

Strategy: generate the tiny checkpoint once per module, load it, compare every parameter with
the stored tensor, check the dtype cast and the error paths (copies of the directory with one
tensor dropped from the index, or a config that no longer fits the tensors, must fail naming
the checkpoint keys), then run one append through a ThinkerEngine built from the loaded pieces.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.checkpoint import Checkpoint, ensure_tiny_checkpoint, load_checkpoint
from backends.checkpoint.loader import CheckpointError
from backends.checkpoint.weight_shards import INDEX_FILE
from backends.contracts.messages import ThinkerRequest
from backends.contracts.sink import ListSink
from backends.runner.types import RunnerConfig
from backends.stages.thinker_engine import ThinkerEngine
from backends.thinker.model import ThinkerModel


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return load_checkpoint(ensure_tiny_checkpoint(Path(tmp_path_factory.mktemp("ckpt")) / "tiny"))


@pytest.fixture(scope="module")
def model(ckpt: Checkpoint) -> ThinkerModel:
    return ThinkerModel.from_checkpoint(ckpt, "cpu", torch.float32)


def test_every_parameter_comes_from_the_checkpoint(ckpt: Checkpoint, model: ThinkerModel) -> None:
    llm = ckpt.weights("llm.")
    for name, param in model.llm.state_dict().items():
        torch.testing.assert_close(param, llm[name], rtol=0, atol=0, msg=name)
    audio = {**{f"apm.{k}": v for k, v in ckpt.weights("apm.").items()},
             **{f"audio_projection_layer.{k}": v
                for k, v in ckpt.weights("audio_projection_layer.").items()}}
    for name, param in model.audio_encoder.state_dict().items():
        torch.testing.assert_close(param, audio[name], rtol=0, atol=0, msg=name)


def test_dtype_cast(ckpt: Checkpoint, model: ThinkerModel) -> None:
    half = ThinkerModel.from_checkpoint(ckpt, "cpu", torch.bfloat16)
    assert {p.dtype for p in half.llm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.audio_encoder.parameters()} == {torch.bfloat16}
    # RoPE frequencies stay exact: rounded ones drift the phase at long positions.
    torch.testing.assert_close(half.llm.rotary.inv_freq, model.llm.rotary.inv_freq, rtol=0, atol=0)


def _copy_without(ckpt: Checkpoint, tmp_path: Path, *keys: str) -> Path:
    copy = Path(shutil.copytree(ckpt.path, tmp_path / "copy"))
    index = json.loads((copy / INDEX_FILE).read_text())
    for key in keys:
        del index["weight_map"][key]
    (copy / INDEX_FILE).write_text(json.dumps(index))
    return copy


@pytest.mark.parametrize("key", ["llm.model.layers.1.mlp.up_proj.weight", "apm.layers.0.fc1.bias",
                                 "audio_projection_layer.linear2.weight"])
def test_a_missing_tensor_is_named_by_its_checkpoint_key(
    ckpt: Checkpoint, tmp_path: Path, key: str
) -> None:
    incomplete = load_checkpoint(_copy_without(ckpt, tmp_path, key))  # prefixes all present
    with pytest.raises(CheckpointError, match=rf"missing 1: {key.replace('.', '[.]')}$"):
        ThinkerModel.from_checkpoint(incomplete, "cpu", torch.float32)


def test_a_config_that_does_not_fit_the_tensors_names_them(
    ckpt: Checkpoint, tmp_path: Path
) -> None:
    wrong = Path(shutil.copytree(ckpt.path, tmp_path / "wrong"))
    config = json.loads((wrong / "config.json").read_text())
    config["intermediate_size"] = 96
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        ThinkerModel.from_checkpoint(load_checkpoint(wrong), "cpu", torch.float32)
    message = str(caught.value)
    assert "wrong shape 6: llm.model.layers.0.mlp.down_proj.weight (64, 192) != (64, 96)" in message
    assert "missing" not in message and "unexpected" not in message


def test_many_problems_are_counted(ckpt: Checkpoint, model: ThinkerModel) -> None:
    state = {f"extra.{i}": torch.zeros(1) for i in range(10)}
    state.update(ckpt.weights("llm."))
    with pytest.raises(CheckpointError, match=r"unexpected 10: llm[.]extra[.]0, .* and 2 more"):
        model.load_llm(state, tie_word_embeddings=False)


def test_missing_llm_weight_is_named(ckpt: Checkpoint, model: ThinkerModel) -> None:
    state = dict(ckpt.weights("llm."))
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        model.load_llm(state, tie_word_embeddings=False)


def test_tied_head_may_be_absent(ckpt: Checkpoint) -> None:
    fresh = ThinkerModel.from_config(ckpt.config, "cpu", torch.float32)
    state = dict(ckpt.weights("llm."))
    del state["lm_head.weight"]
    fresh.load_llm(state, tie_word_embeddings=True)
    torch.testing.assert_close(fresh.llm.lm_head.weight, state["model.embed_tokens.weight"])


def test_engine_runs_on_the_loaded_thinker(ckpt: Checkpoint, model: ThinkerModel) -> None:
    engine = ThinkerEngine(
        model.llm, model.audio_encoder, ckpt.tokenizer, ckpt.special_tokens,
        RunnerConfig(num_blocks=32, max_num_reqs=1, max_model_len=256),
    )
    audio = (np.random.default_rng(0).standard_normal(16000) * 0.1).astype(np.float32)
    sink = ListSink()
    engine.submit(ThinkerRequest("r", audio, initial_user_text="hi", seed=1), sink)
    while engine.has_work():
        engine.step()
    assert sink.closed and sink.error is None and len(sink.results) == 1
    assert sink.results[0].token_ids[-1] in ckpt.special_tokens.chunk_terminators
