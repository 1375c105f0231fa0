"""The runner config a served stage gets from its setup: on CUDA the fast path with the Triton
GEMV and the Thinker's long prefills in chunks its mixed graphs hold, on CPU the reference path;
Code2Wav's first-window hold comes from its `first_window_hold_ms` parameter (the profile's
`code2wav_first_hold_ms`). Pure configuration: no device is touched."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backends.serving.profiles import PROFILES
from backends.stages.factory import StageSetup, first_window_hold_s, prefill_chunk_rows
from backends.stages.window_schedule import FIRST_WINDOW_HOLD_S


def setup_on(device: str) -> StageSetup:
    return StageSetup(checkpoint="tiny", device=torch.device(device), dtype=torch.bfloat16,
                      max_sessions=4, max_context_tokens=1024, talker_context_tokens=512)  # fmt: skip


def test_cuda_stages_take_the_fast_path_on_the_triton_gemv() -> None:
    config = setup_on("cuda:0").runner_config(1024)
    assert (config.attention_backend, config.gemv_backend) == ("triton", "triton")
    assert config.max_num_reqs == 4 + 2 and config.max_model_len == 1024
    assert not config.compact_rows_on_cpu  # hooked rows go compact on CUDA either way


def test_cpu_stages_keep_the_reference_path() -> None:
    config = setup_on("cpu").runner_config(512)
    assert (config.attention_backend, config.gemv_backend) == ("reference", "cublas")


def test_graphed_thinkers_prefill_in_chunks_of_the_mixed_graphs_query() -> None:
    cuda = setup_on("cuda:0").runner_config(1024)
    assert prefill_chunk_rows(cuda) == cuda.mixed_graph_max_query_len == 32
    assert prefill_chunk_rows(replace(cuda, mixed_graph_max_query_len=16)) == 16
    assert prefill_chunk_rows(replace(cuda, mixed_cuda_graphs=False)) == 0  # every prefill eager anyway
    assert prefill_chunk_rows(replace(cuda, use_cuda_graphs=False)) == 0
    assert prefill_chunk_rows(setup_on("cpu").runner_config(1024)) == 0


def test_the_first_window_hold_is_read_in_ms_and_bad_values_are_refused() -> None:
    assert first_window_hold_s({}) == FIRST_WINDOW_HOLD_S == PROFILES["cpu"].code2wav_first_hold_ms / 1000
    assert first_window_hold_s({"first_window_hold_ms": "0"}) == 0.0
    assert first_window_hold_s({"first_window_hold_ms": "80"}) == pytest.approx(0.08)
    for bad in ("soon", "-5", "5000"):
        with pytest.raises(ValueError, match="first_window_hold_ms"):
            first_window_hold_s({"first_window_hold_ms": bad})
