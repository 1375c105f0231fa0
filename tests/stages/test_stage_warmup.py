"""The stage warm-up drives real requests through the Thinker and Talker engines and leaves
nothing held; a failing warm-up request fails the load."""

from __future__ import annotations

import pytest

from backends.stages.factory import WARMUP_TEXT_TOKEN, build_talker_engine, build_thinker_engine
from backends.stages.warmup import talker_request_maker, thinker_request, warm_up, warmup_group_sizes

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


def test_a_failing_warm_up_request_fails_the_load() -> None:
    engine = build_thinker_engine(TINY)

    def fail(request_id: str) -> None:
        raise RuntimeError("injected")

    engine.fault_hook = fail
    with pytest.raises(RuntimeError, match="warm-up request failed"):
        warm_up(engine, "thinker", thinker_request, max_sessions=2)
    assert engine.resource_counts()["requests"] == 0
