"""RequestStates: slot handout order, full reset on recycling, token-history edits.

Strategy: literal slot numbers and per-slot fields after add / remove / re-add, so a field
that is not reset when a slot is recycled fails by name.
"""

from __future__ import annotations

import pytest

from backends.runner.request_states import RequestStates
from backends.runner.types import AdmissionError, SamplingParams


class NoopHook:
    def before_sample(self, logits, ctx):  # type: ignore[no-untyped-def]
        return None

    def after_sample(self, token, ctx):  # type: ignore[no-untyped-def]
        return token


def test_recycled_slot_is_fully_reset() -> None:
    states = RequestStates(max_num_reqs=2, max_model_len=8)
    slot = states.add("a", SamplingParams(temperature=0.7, seed=3), NoopHook(), max_len=8)
    states.append_tokens(slot, [5, 6, 7])
    states.generated[slot].append(9)
    states.drop_tokens(slot, 0, 1)
    assert states.remove("a") == slot and states.remove("a") is None
    assert states.add("b", SamplingParams(), None, max_len=4) == slot  # most recent slot first
    assert states.token_ids(slot) == [] and states.generated[slot] == []
    assert states.hooks[slot] is None and states.sampling[slot] == SamplingParams()
    assert int(states.num_dropped_np[slot]) == 0 and int(states.max_len_np[slot]) == 4
    assert states.token_ids_np[slot].tolist() == [0] * 8


def test_drop_tokens_shifts_later_rows() -> None:
    states = RequestStates(max_num_reqs=1, max_model_len=10)
    slot = states.add("a", SamplingParams(), None, max_len=10)
    states.append_tokens(slot, list(range(10, 20)))
    states.drop_tokens(slot, 2, 4)
    assert states.token_ids(slot) == [10, 11, 16, 17, 18, 19]
    assert int(states.num_dropped_np[slot]) == 4


def test_errors_name_the_request() -> None:
    states = RequestStates(max_num_reqs=1, max_model_len=4)
    states.add("a", SamplingParams(), None, max_len=4)
    with pytest.raises(ValueError, match="'a' is already active"):
        states.add("a", SamplingParams(), None, max_len=4)
    with pytest.raises(AdmissionError, match="'b'.*slots"):
        states.add("b", SamplingParams(), None, max_len=4)
    with pytest.raises(ValueError, match="unknown request 'c'"):
        states.slot_of("c")
