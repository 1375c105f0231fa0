"""The stage warm-up drives real requests through the Thinker, Talker and Code2Wav engines
and leaves nothing held; a failing warm-up request fails the load; Code2Wav's warm-up runs
every batch bucket with first, growing, steady and final windows, for a partial final window
and for the look-ahead flush alone, and runs the HiFT at every final window's length (the one
part a final window cannot pad into a captured graph)."""

from __future__ import annotations

import re

import pytest
import torch

from backends.models.token2wav import graphs
from backends.models.token2wav.graphs import frame_bucket
from backends.stages.factory import (
    WARMUP_TEXT_TOKEN, build_code2wav_engine, build_talker_engine, build_thinker_engine,
)
from backends.stages.warmup import (
    CODE2WAV_FINAL_FRAMES, CODE2WAV_LONE_FINAL_FRAMES, CODE2WAV_WINDOWS, code2wav_request_maker, code2wav_warmup_sizes,
    cuda_memory_note,
    talker_request_maker, thinker_request, warm_up, warm_up_code2wav, warmup_group_sizes,
)

TINY = {"checkpoint": "tiny", "max_sessions": "4"}


def test_group_sizes_cover_one_two_three_and_a_multiple_of_16() -> None:
    assert warmup_group_sizes(1) == [1]
    assert warmup_group_sizes(4) == [1, 2, 3]
    assert warmup_group_sizes(16) == [1, 2, 3, 16]
    assert warmup_group_sizes(64) == [1, 2, 3, 32]


def _assert_released(engine) -> None:
    counts = engine.resource_counts()
    assert counts["requests"] == 0 and counts["runner_requests"] == 0, counts
    assert counts["kv_free_blocks"] == counts["kv_blocks"], counts


def test_thinker_warm_up_runs_replies_and_frees_everything() -> None:
    engine = build_thinker_engine(TINY)
    assert warm_up(engine, "thinker", thinker_request, max_sessions=4) > 0
    _assert_released(engine)


def test_talker_warm_up_streams_frames_and_frees_everything() -> None:
    engine = build_talker_engine(TINY)
    maker = talker_request_maker(engine._model.config.llm_dim, WARMUP_TEXT_TOKEN)
    warm_up(engine, "talker", maker, max_sessions=3)
    _assert_released(engine)


def test_the_warm_up_log_states_cuda_memory_only_where_cuda_runs() -> None:
    # how close a stage's load came to its memory share is read from this line
    if not torch.cuda.is_available():
        assert cuda_memory_note() == ""
        return
    held = torch.zeros(1 << 20, device="cuda")
    note = cuda_memory_note()
    assert re.fullmatch(r"; CUDA memory peak [0-9.]+ GiB reserved \([0-9.]+ GiB allocated\), now [0-9.]+ GiB "
                        r"reserved", note), note
    del held


def test_a_failing_warm_up_request_fails_the_load() -> None:
    engine = build_thinker_engine(TINY)

    def fail(request_id: str) -> None:
        raise RuntimeError("injected")

    engine.fault_hook = fail
    with pytest.raises(RuntimeError, match="warm-up request failed"):
        warm_up(engine, "thinker", thinker_request, max_sessions=2)
    assert engine.resource_counts()["requests"] == 0


def test_code2wav_group_sizes_are_the_batch_buckets_up_to_the_cap() -> None:
    assert code2wav_warmup_sizes(max_batch=8, pool_streams=64) == [1, 2, 4, 8]
    assert code2wav_warmup_sizes(max_batch=6, pool_streams=64) == [1, 2, 4, 6]  # 6 windows: bucket 8
    assert code2wav_warmup_sizes(max_batch=16, pool_streams=8) == [1, 2, 4, 8]
    assert code2wav_warmup_sizes(max_batch=1, pool_streams=8) == [1]


def test_code2wav_warm_up_runs_each_bucket_through_a_whole_stream() -> None:
    service = build_code2wav_engine({**TINY, "max_batch": "8"})
    token2wav = service.engine.token2wav
    token2wav.enable_cuda_graphs()  # on CPU the graph wrappers (and their batch padding) run eagerly
    batches: list[tuple[int, bool]] = []
    decode = token2wav.decode

    def record(windows, *args, **kwargs):
        batches.append((len(windows), any(w.last_chunk for w in windows)))
        return decode(windows, *args, **kwargs)

    token2wav.decode = record
    warm_up(service, "code2wav", code2wav_request_maker(), 4, code2wav_warmup_sizes(8, 8), CODE2WAV_WINDOWS)
    assert [b for b, _ in batches] == [n for n in (1, 2, 4, 8) for _ in range(CODE2WAV_WINDOWS)]
    assert [last for _, last in batches] == [w == CODE2WAV_WINDOWS - 1 for _ in range(4) for w in range(CODE2WAV_WINDOWS)]
    counts = service.resource_counts()
    assert counts["codec_states"] == counts["codec_sequences"] == counts["codec_pending"] == 0, counts
    assert token2wav.cache_pool.num_free() == 2 * 4  # two slots per session


def test_code2wav_warm_up_covers_every_final_window_bucket() -> None:
    """Every final window (3 context + 0-24 new codes: 6-54 mel frames) lands in a frame bucket
    the warm-up captures: the 50 of every full window, or the 56 of its 24-code final window."""
    warmed = {frame_bucket(50)} | {frame_bucket(2 * (3 + new)) for new in CODE2WAV_FINAL_FRAMES}
    assert {frame_bucket(2 * (3 + new)) for new in range(25)} <= warmed


def test_code2wav_warm_up_ends_its_streams_on_a_final_window() -> None:
    """The served warm-up (`warm_up_code2wav`) runs every bucket's streams, ending on a
    24-code final window, then a lone stream ending on each other final length (0-23 new
    codes), each stream's windows in order and nothing held after it."""
    service = build_code2wav_engine({**TINY, "max_batch": "4"})
    token2wav = service.engine.token2wav
    token2wav.enable_cuda_graphs()
    finals: list[tuple[int, ...]] = []
    decode = token2wav.decode

    def record(windows, *args, **kwargs):
        if windows[0].last_chunk:  # a group's final windows: their code counts
            finals.append(tuple(sorted({len(w.codes) for w in windows})))
        return decode(windows, *args, **kwargs)

    token2wav.decode = record
    assert CODE2WAV_FINAL_FRAMES == (24,)
    warm_up_code2wav(service, max_sessions=4, max_batch=4, pool_streams=8)
    sizes = code2wav_warmup_sizes(4, 8)
    assert finals == [(3 + 24,)] * len(sizes) + [(3 + new,) for new in range(24)]
    assert CODE2WAV_LONE_FINAL_FRAMES == tuple(range(24))
    counts = service.resource_counts()
    assert counts["codec_states"] == counts["codec_sequences"] == counts["codec_pending"] == 0, counts
    assert token2wav.cache_pool.num_free() == 8


def test_code2wav_warm_up_runs_the_hift_at_every_final_window_length(monkeypatch) -> None:
    """The HiFT graphs are sealed after the warm-up, and a final window's HiFT runs at its own
    length: a stream ending on any final window (0-24 new codes, each one lone stream, as a
    reply's last window is) calls the HiFT at shapes the warm-up called it at, so it replays
    a graph instead of running eagerly."""
    service = build_code2wav_engine({**TINY, "max_batch": "4"})
    service.engine.token2wav.enable_cuda_graphs()  # on CPU: the graph wrappers, run eagerly
    shapes: list[tuple[int, int, tuple[int, ...]]] = []  # (rows, mel frames, source-cache lengths)
    call = graphs.HiFTGraphs.__call__

    def spy(self, mel, source_cache, noise):
        shapes.append((mel.shape[0], mel.shape[2], tuple(c.shape[0] for c in source_cache)))
        return call(self, mel, source_cache, noise)

    monkeypatch.setattr(graphs.HiFTGraphs, "__call__", spy)
    warm_up_code2wav(service, max_sessions=4, max_batch=4, pool_streams=8)
    warmed = set(shapes)
    shapes.clear()
    for new in range(25):
        warm_up(service, "code2wav", code2wav_request_maker(final_frames=new, seed=new + 1), 4, [1],
                CODE2WAV_WINDOWS)
    served = set(shapes)
    assert len(served) == 26  # the first window's, the steady windows' and 24 final lengths
    assert served <= warmed, sorted(served - warmed)
