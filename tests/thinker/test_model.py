"""ThinkerModel: assembly from the generated tiny checkpoint (real key layout).

Strategy: generate the tiny checkpoint once per module, load it, compare every parameter with
the stored tensor, check the dtype cast and the error paths, then run one append through a
ThinkerEngine built from the loaded pieces.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.checkpoint import Checkpoint, ensure_tiny_checkpoint, load_checkpoint
from backends.runner.types import RunnerConfig
from backends.stages.contracts import ThinkerRequest
from backends.stages.sink import ListSink
from backends.stages.thinker_engine import ThinkerEngine
from backends.thinker.model import ThinkerModel


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny ops are dominated by thread hand-off on a loaded 2-core box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


def test_dtype_cast(ckpt: Checkpoint) -> None:
    half = ThinkerModel.from_checkpoint(ckpt, "cpu", torch.bfloat16)
    assert {p.dtype for p in half.llm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.audio_encoder.parameters()} == {torch.bfloat16}


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
