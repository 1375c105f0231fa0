"""perf/workload.py: the bundled prompts and voices, and groups as in the Seed-TTS duplex
benchmark (seeded, one voice per group, reply units within the configured shape)."""
from __future__ import annotations

import numpy as np
import pytest

from perf.workload import ReplyShape, Workload, load_prompts, load_voices


@pytest.fixture(scope="module")
def workload():
    return Workload.load(ReplyShape())


def test_bundled_prompts_and_voices(workload):
    assert len(workload.prompts) >= 20
    assert all(not p.startswith("#") and p for p in workload.prompts)
    assert len(workload.voices) >= 2
    for voice in workload.voices.values():
        assert voice.dtype == np.int16 and voice.ndim == 1 and voice.size >= 16000
        assert np.abs(voice.astype(np.int32)).max() > 1000  # not silence


def test_groups_are_a_pure_function_of_the_seed(workload):
    assert workload.groups(3, 4, seed=7) == workload.groups(3, 4, seed=7)
    assert workload.groups(3, 4, seed=7) != workload.groups(3, 4, seed=8)


def test_a_group_shares_one_voice_and_uses_consecutive_rows(workload):
    groups = workload.groups(4, 4, seed=1)
    texts = [turn.text for group in groups for turn in group]
    assert len(set(texts)) == len(texts)  # 16 of the 24 shuffled rows, none repeated
    for group in groups:
        assert len({turn.voice for turn in group}) == 1
        assert [turn.turn for turn in group] == [0, 1, 2, 3]


def test_reply_shape_is_respected(workload):
    units = [t.reply_units for g in workload.groups(8, 4, seed=0) for t in g]
    assert min(units) >= 4 and max(units) <= 6 and len(set(units)) > 1
    assert {t.tokens_per_unit for g in workload.groups(2, 2, seed=0) for t in g} == {4}


@pytest.mark.parametrize("args", [(0, 6, 4), (5, 4, 4), (4, 6, 0), (4, 6, 18)])
def test_bad_reply_shapes_are_refused(args):
    with pytest.raises(ValueError):
        ReplyShape(*args)


def test_loaders_reject_empty_inputs(tmp_path):
    (tmp_path / "prompts.txt").write_text("# only a comment\n\n")
    with pytest.raises(ValueError, match="no prompt"):
        load_prompts(tmp_path / "prompts.txt")
    with pytest.raises(ValueError, match="no reference voices"):
        load_voices(tmp_path)
