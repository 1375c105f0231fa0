"""backends/talker/chain_harvest.py: a result's draws into a chunk, a slice at a time.

Strategy: the slice-wise take must equal taking the codes one by one (the engine's old loop,
written out here): the same codes kept, the same groups sent at the same points, and a sink
that ends the request in a send stops the take right there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.contracts.messages import TalkerRequest
from backends.contracts.sink import ListSink
from backends.models.talker_policy import ChunkKind
from backends.runner.types import StepInput
from backends.talker.chain_harvest import codes_before_end, take_codes
from backends.talker.condition import Condition
from backends.talker.request_state import FRAMES_PER_GROUP, ActiveChunk

EOS = 6561


def new_chunk(sink: ListSink, codes: int = 0) -> ActiveChunk:
    request = TalkerRequest("r", 0, np.zeros(1, np.int32), np.zeros((1, 4), np.float32))
    condition = Condition(request, sink, ChunkKind.TURN_END, torch.zeros(2, 4))
    chunk = ActiveChunk(condition, StepInput("r", [0]), codes=list(range(codes)))
    chunk.num_sent = codes - codes % FRAMES_PER_GROUP
    return chunk


@pytest.mark.parametrize(
    ("tokens", "room", "kept"),
    [([1, 2, 3], 10, 3), ([1, EOS, 3], 10, 1), ([EOS], 10, 0), ([1, 2, 3], 2, 2), ([1], 0, 0)],
)
def test_codes_before_end(tokens: list[int], room: int, kept: int) -> None:
    assert codes_before_end(tokens, EOS, room) == kept


@pytest.mark.parametrize("before", [0, 3, 20, 24, 25, 49])
@pytest.mark.parametrize("count", [1, 8, 16, 30, 60])
def test_take_codes_sends_the_groups_one_by_one_would(before: int, count: int) -> None:
    codes = list(range(1000, 1000 + count))
    sliced, single = ListSink(), ListSink()
    chunk, reference = new_chunk(sliced, before), new_chunk(single, before)
    assert take_codes(chunk, codes, lambda: True)
    for code in codes:  # the engine's old per-code loop
        reference.codes.append(code)
        if reference.group_ready():
            single.send(reference.take_group(finished=False))
    assert chunk.codes == reference.codes and chunk.num_sent == reference.num_sent
    assert [g.codes.tolist() for g in sliced.results] == [g.codes.tolist() for g in single.results]


def test_a_send_that_ends_the_request_stops_the_take() -> None:
    sink = ListSink()
    chunk = new_chunk(sink, 20)
    assert not take_codes(chunk, list(range(40)), lambda: not sink.results)
    assert len(chunk.codes) == FRAMES_PER_GROUP and len(sink.results) == 1
