"""The runner config a served stage gets from its setup: on CUDA the fast path with the Triton
GEMV (MINICPMO_GEMV selects cuBLAS for A/B runs, a bad value is refused at load), on CPU the
reference path; on CUDA the Thinker's long prefills go in chunks its mixed graphs hold
(MINICPMO_PREFILL_CHUNKS=0: whole) and hooked rows reach the host as summaries
(MINICPMO_COMPACT_HOST_ROWS=0: whole) and its graphed encoder passes attend over key buckets
(MINICPMO_ENCODER_KEY_BUCKETS=0: the whole table) through the split-key kernel
(MINICPMO_ENCODER_SPLIT_KEYS=0: torch's fused attention); Code2Wav's first-window hold comes from
MINICPMO_CODE2WAV_FIRST_HOLD_MS. Pure configuration: no device is touched."""
from __future__ import annotations

import pytest
import torch

from dataclasses import replace
from typing import Callable

from backends.stages.factory import (
    COMPACT_ROWS_ENV, FIRST_WINDOW_HOLD_ENV, GEMV_ENV, KEY_BUCKETS_ENV, PREFILL_CHUNKS_ENV, SPLIT_KEYS_ENV,
    StageSetup, encoder_key_buckets, encoder_split_keys, first_window_hold_s, prefill_chunk_rows,
)
from backends.stages.window_schedule import FIRST_WINDOW_HOLD_S


def setup_on(device: str) -> StageSetup:
    return StageSetup(checkpoint="tiny", device=torch.device(device), dtype=torch.bfloat16,
                      max_sessions=4, max_context_tokens=1024, talker_context_tokens=512)  # fmt: skip


def test_cuda_stages_take_the_fast_path_on_the_triton_gemv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GEMV_ENV, raising=False)
    config = setup_on("cuda:0").runner_config(1024)
    assert (config.attention_backend, config.gemv_backend) == ("triton", "triton")
    assert config.max_num_reqs == 4 + 2 and config.max_model_len == 1024


def test_the_switch_selects_cublas_and_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GEMV_ENV, "cublas")
    assert setup_on("cuda:0").runner_config(512).gemv_backend == "cublas"
    monkeypatch.setenv(GEMV_ENV, "cutlass")
    with pytest.raises(ValueError, match="gemv_backend"):
        setup_on("cuda:0").runner_config(512)


def test_cpu_stages_keep_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GEMV_ENV, "triton")  # the switch only applies on CUDA
    config = setup_on("cpu").runner_config(512)
    assert (config.attention_backend, config.gemv_backend) == ("reference", "cublas")


def test_graphed_thinkers_prefill_in_chunks_of_the_mixed_graphs_query(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFILL_CHUNKS_ENV, raising=False)
    cuda = setup_on("cuda:0").runner_config(1024)
    assert prefill_chunk_rows(cuda) == cuda.mixed_graph_max_query_len == 32
    assert prefill_chunk_rows(replace(cuda, mixed_graph_max_query_len=16)) == 16
    assert prefill_chunk_rows(replace(cuda, mixed_cuda_graphs=False)) == 0  # every prefill eager anyway
    assert prefill_chunk_rows(replace(cuda, use_cuda_graphs=False)) == 0
    assert prefill_chunk_rows(setup_on("cpu").runner_config(1024)) == 0
    monkeypatch.setenv(PREFILL_CHUNKS_ENV, "0")
    assert prefill_chunk_rows(cuda) == 0


def test_hooked_rows_go_compact_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPACT_ROWS_ENV, raising=False)
    assert setup_on("cuda:0").runner_config(512).compact_host_rows == "auto"  # on CUDA: compact
    monkeypatch.setenv(COMPACT_ROWS_ENV, "0")
    assert setup_on("cuda:0").runner_config(512).compact_host_rows == "off"


def test_the_first_window_hold_is_read_in_ms_and_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FIRST_WINDOW_HOLD_ENV, raising=False)
    assert first_window_hold_s() == FIRST_WINDOW_HOLD_S
    monkeypatch.setenv(FIRST_WINDOW_HOLD_ENV, "0")
    assert first_window_hold_s() == 0.0
    monkeypatch.setenv(FIRST_WINDOW_HOLD_ENV, "80")
    assert first_window_hold_s() == pytest.approx(0.08)
    for bad in ("soon", "-5", "5000"):
        monkeypatch.setenv(FIRST_WINDOW_HOLD_ENV, bad)
        with pytest.raises(ValueError, match=FIRST_WINDOW_HOLD_ENV):
            first_window_hold_s()


@pytest.mark.parametrize(("name", "read"), [(KEY_BUCKETS_ENV, encoder_key_buckets),
                                            (SPLIT_KEYS_ENV, encoder_split_keys)])
def test_encoder_switches_stay_on_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch, name: str, read: Callable[[], bool],
) -> None:
    monkeypatch.delenv(name, raising=False)
    assert read() is True
    monkeypatch.setenv(name, "0")
    assert read() is False
    for bad in ("off", "yes"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            read()
