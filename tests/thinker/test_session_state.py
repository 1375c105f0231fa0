"""ThinkerSession without a runner: step results are fed by hand.

Strategy: a fake encoder and hand-written StepResults (sampled token, positions, hidden rows
with values that identify their row) drive the session through two appends, so the layout,
snapshot, ledger capture, terminator re-injection and the unit results are checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.contracts.messages import DECISION_SPEAK, ThinkerRequest
from backends.contracts.sink import ListSink
from backends.runner.hidden_ledger import HiddenLedger
from backends.runner.types import SampleContext, StepInput, StepResult
from backends.thinker.duplex_policy import DuplexPolicy
from backends.thinker.policy_config import PolicyConfig
from backends.thinker.prompt_layout import PromptLayout
from backends.thinker.session_state import IsolatingHook, QueuedAppend, ThinkerSession

HIDDEN = 4
A, B = 300, 301


class FakeEncoder:
    def __init__(self) -> None:
        self.num_resets = 0

    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        return torch.zeros(10, HIDDEN)

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        return torch.zeros(len(samples) // 1600, HIDDEN)

    def reset(self) -> None:
        self.num_resets += 1


@pytest.fixture()
def session(tokenizer: TextTokenizer, special: SpecialTokens) -> ThinkerSession:
    policy = DuplexPolicy(special, tokenizer, PolicyConfig())
    return ThinkerSession(
        "s", FakeEncoder(), policy, PromptLayout(tokenizer, special), tokenizer,
        HiddenLedger(HIDDEN, 64),
    )


def _queue(session: ThinkerSession, seq: int, **fields: object) -> ListSink:
    sink = ListSink()
    request = ThinkerRequest("s", np.full(16000, 0.1, dtype=np.float32), seq=seq, **fields)
    session.queue.append(QueuedAppend(request, sink))
    return sink


def _embed(ids: torch.Tensor) -> torch.Tensor:
    return torch.zeros(ids.shape[0], HIDDEN)


def _row(position: int) -> torch.Tensor:
    return torch.full((1, HIDDEN), float(position))


def _decide(session: ThinkerSession, sampled: list[int], first_position: int):
    """Prefill the active append, then decode `sampled` (the prefill samples sampled[0])."""
    inp = session.next_input(_embed, "cpu", torch.float32)
    assert inp.embeds is not None and not inp.capture_hidden
    positions = list(range(first_position, first_position + inp.num_rows))
    result = session.consume(inp, StepResult("s", positions, sampled[0], None))
    position = first_position + inp.num_rows
    for token in sampled[1:]:
        assert result is None
        inp = session.next_input(_embed, "cpu", torch.float32)
        assert inp.capture_hidden and inp.embeds is None
        result = session.consume(inp, StepResult("s", [position], token, _row(position)))
        position += 1
    return inp, result, position


def test_two_appends(session: ThinkerSession, special: SpecialTokens) -> None:
    session.setup(ThinkerRequest("s", np.zeros(16000, np.float32), initial_user_text="hi"))
    _queue(session, 0, initial_user_text="hi")
    session.activate()
    _, first, position = _decide(session, [special.tts_bos, special.chunk_eos], 0)
    assert first.decision == DECISION_SPEAK and first.tts_token_ids.size == 0
    assert not first.turn_start  # an empty handoff cannot carry the turn start
    assert session.snapshot.tail == special.audio

    _queue(session, 1)
    active = session.activate()
    assert active.rows.token_ids[:3] == [special.chunk_eos, special.unit_end, special.unit]
    start = position
    _, second, _ = _decide(session, [special.speak, A, B, special.chunk_eos], start)
    head_rows = 13
    assert second.turn_start and second.segment_end and not second.turn_end
    assert second.tts_token_ids.tolist() == [A, B]
    expected = torch.cat([_row(start + head_rows + 1), _row(start + head_rows + 2)]).numpy()
    np.testing.assert_array_equal(second.tts_hidden, expected)
    assert second.unit_index == 1 and session.pending_terminator == special.chunk_eos


def test_failed_layout_leaves_the_append_queued(session: ThinkerSession) -> None:
    session.setup(ThinkerRequest("s", np.zeros(16000, np.float32)))
    sink = _queue(session, 0)

    def broken(samples: np.ndarray) -> torch.Tensor:
        raise RuntimeError("encoder down")

    session.encoder.encode_unit = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="encoder down"):
        session.activate()
    assert session.queue[0].sink is sink and session.active is None


def test_close_resets_the_encoder_and_drops_work(session: ThinkerSession) -> None:
    session.setup(ThinkerRequest("s", np.zeros(16000, np.float32)))
    _queue(session, 0)
    session.activate()
    session.close()
    assert session.encoder.num_resets == 1 and not session.has_work


def test_isolating_hook_keeps_the_error(tokenizer, special) -> None:
    policy = DuplexPolicy(special, tokenizer, PolicyConfig())
    hook = IsolatingHook(policy, special.chunk_eos)

    def explode(*_: object) -> int:
        raise ValueError("policy bug")

    policy.before_sample = explode  # type: ignore[method-assign]
    ctx = SampleContext("s", 0, [])
    assert hook.before_sample(torch.zeros(1000), ctx) == special.chunk_eos
    assert hook.after_sample(special.chunk_eos, ctx) == special.chunk_eos
    assert isinstance(hook.error, ValueError)


def test_consume_raises_the_hook_error(session: ThinkerSession) -> None:
    session.setup(ThinkerRequest("s", np.zeros(16000, np.float32)))
    _queue(session, 0)
    session.activate()
    session.hook.error = RuntimeError("from inside the step")
    inp = StepInput("s", [1])
    with pytest.raises(RuntimeError, match="inside the step"):
        session.consume(inp, StepResult("s", [0], 5, None))
