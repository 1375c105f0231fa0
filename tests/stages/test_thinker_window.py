"""ThinkerEngine with long sessions: the context window modes of
docs/model_facts.md#context-window.

Strategy: a tiny random Qwen3 with the tiny checkpoint's tokenizer and a fixed linear fake
audio encoder (fast), driven one append at a time like the orchestrator does, with the runner
at its production page size of 16. The session mixes speech-level noise (the natural policy
on random weights speaks up to 20 tokens) with client-forced listens and a few two-unit
appends, so unit lengths vary as with a real model. After each append the KV is checked
against the window's bookkeeping: the sink is untouched, every retained unit starts where the
window says, the reservation never changes and the KV never passes the high watermark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.contracts.errors import StageError
from backends.contracts.messages import ThinkerRequest, ThinkerUnitResult
from backends.contracts.sink import ListSink
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.runner.types import RunnerConfig
from backends.stages.thinker_engine import ThinkerEngine, ThinkerEngineConfig
from backends.thinker.context_window import WindowConfig
from backends.thinker.duplex_policy import special_token_ids
from backends.thinker.prompt_layout import PREVIOUS_MARKER

HIDDEN = 32
UNIT = 16000
MAX_LEN = 1024  # per-session reservation
# 10 minutes of 1-second units. The window of 512..896 tokens holds 30..60 units, so about
# 15 cuts happen; each needs a page-aligned unit start (docs/model_facts.md#context-window),
# which 60+ candidates give.
TEN_MINUTES = 600
WINDOW = WindowConfig(high_tokens=896, low_tokens=512, previous_max_tokens=32, max_units=8)
MAX_STEPS_PER_APPEND = 80  # a prefill (in chunks of 8: a restart of <= ~350 rows), <= 19 decodes
MIN_UNIT_ROWS = 13  # a listen unit: terminator, </unit>, <unit>, 10 embeddings
MAX_UNIT_ROWS = 32  # a unit that speaks 19 tokens before its terminator


class FakeEncoder:
    """[16000] samples -> [10, HIDDEN] by a fixed projection."""

    def __init__(self) -> None:
        self.weight = torch.randn(1600, HIDDEN, generator=torch.Generator().manual_seed(99))

    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples).view(10, 1600) @ self.weight

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples).view(-1, 1600) @ self.weight

    def reset(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)


@pytest.fixture(scope="module")
def special(tokenizer: TextTokenizer) -> SpecialTokens:
    return SpecialTokens.resolve(tokenizer)


@pytest.fixture(scope="module")
def engine_parts(tokenizer: TextTokenizer, special: SpecialTokens):
    torch.manual_seed(0)
    llm = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, vocab_size=1024,
    )).eval()
    return llm, tokenizer, special


def _engine(engine_parts, mode: str = "off", prefill_chunk_rows: int = 0) -> ThinkerEngine:
    llm, tokenizer, special = engine_parts
    runner = RunnerConfig(num_blocks=3 * MAX_LEN // 16, max_num_reqs=3, max_model_len=MAX_LEN)
    config = ThinkerEngineConfig(window_mode=mode, window=WINDOW, prefill_chunk_rows=prefill_chunk_rows)
    return ThinkerEngine(llm, None, tokenizer, special, runner, config, FakeEncoder)


def _session(request_id: str, num_units: int, mode: str = "") -> Iterator[ThinkerRequest]:
    """Appends of `num_units` units in total: noise (speech, a free decision) once in three,
    forced listens otherwise, and every 25th append carries two units."""
    rng = np.random.default_rng(1)
    seq, unit = 0, 0
    while unit < num_units:
        count = 2 if seq % 25 == 24 and unit + 2 <= num_units else 1
        free = seq % 3 == 0
        audio = (rng.standard_normal(count * UNIT) * (0.1 if free else 0.0)).astype(np.float32)
        yield ThinkerRequest(request_id, audio, seq=seq, force_listen=not free, seed=3,
                             sliding_window_mode=mode)
        seq, unit = seq + 1, unit + count


def _append(engine: ThinkerEngine, request: ThinkerRequest) -> ListSink:
    sink = ListSink()
    engine.submit(request, sink)
    for _ in range(MAX_STEPS_PER_APPEND):
        if not engine.has_work():
            return sink
        engine.step()
    raise AssertionError("the append did not finish")


def _unit(sink: ListSink) -> ThinkerUnitResult:
    assert sink.closed and sink.error is None, sink.error
    assert len(sink.results) == 1
    return sink.results[0]


def test_window_off_ends_a_long_session_with_context_length_exceeded(engine_parts) -> None:
    engine = _engine(engine_parts)
    free_at_start = engine.runner.num_free_blocks()
    other = _append(engine, next(_session("other", 1)))
    error: StageError | None = None
    for request in _session("long", TEN_MINUTES):
        sink = _append(engine, request)
        if sink.error is not None:
            error = sink.error
            break
        _unit(sink)
    assert error is not None and error.code == "context_length_exceeded"
    assert error.message.startswith("context_length_exceeded") and "window off" in error.message
    assert request.seq > (MAX_LEN - 100) // MAX_UNIT_ROWS  # it ran until the context was full
    assert not engine.runner.has_request("long") and engine.num_sessions() == 1
    late = _append(engine, ThinkerRequest("long", np.zeros(UNIT, np.float32), seq=request.seq + 1))
    assert late.error is not None and late.error.code == "invalid_argument"
    _unit(other)
    _unit(_append(engine, ThinkerRequest("other", np.zeros(UNIT, np.float32), seq=1)))
    engine.stop("other")
    assert engine.runner.num_free_blocks() == free_at_start


def _check_basic_kv(engine: ThinkerEngine, special: SpecialTokens, sink_ids: list[int]) -> None:
    session = engine._sessions["long"]
    window, kv = session.window, engine.runner.token_ids("long")
    assert len(kv) <= WINDOW.high_tokens
    assert kv[: len(sink_ids)] == sink_ids
    if window.position_offset:  # after a cut, nothing of a dropped unit stays behind the sink
        assert window.units[0].start - window.units[0].head == window.prefix_len
    for unit in window.units:
        assert kv[unit.start] == special.unit
        head = kv[unit.start - unit.head : unit.start]
        assert head[-1:] == [special.unit_end][: unit.head]
        assert unit.head < 2 or head[0] in special.chunk_terminators
    assert session.policy.position_offset == window.position_offset


@pytest.mark.parametrize("chunk_rows", [0, 8])  # appends prefilled whole, or 8 rows per step
def test_basic_window_runs_ten_minutes_with_bounded_kv(engine_parts, special, chunk_rows) -> None:
    engine = _engine(engine_parts, "basic", chunk_rows)
    free_while_running = engine.runner.num_free_blocks() - MAX_LEN // 16  # exact reservation
    num_units, sink_ids = 0, None
    for request in _session("long", TEN_MINUTES):
        result = _unit(_append(engine, request))
        num_units += request.audio.size // UNIT
        assert result.unit_index == num_units - 1
        if sink_ids is None:
            window = engine._sessions["long"].window
            sink_ids = engine.runner.token_ids("long")[: window.prefix_len]  # the system context, exactly
        _check_basic_kv(engine, special, sink_ids)
        assert engine.runner.num_free_blocks() == free_while_running
    window = engine._sessions["long"].window
    assert num_units == TEN_MINUTES
    assert window.position_offset > TEN_MINUTES * 13 - MAX_LEN  # units were really dropped
    assert 10 <= len(window.units) <= WINDOW.high_tokens // MIN_UNIT_ROWS


@pytest.mark.parametrize("chunk_rows", [0, 8])  # a rebuilt prompt in one step, or in chunks
def test_context_window_keeps_max_units_and_the_previous_text(engine_parts, special, chunk_rows) -> None:
    engine = _engine(engine_parts, "off", chunk_rows)
    dropped_text: list[int] = []
    units: list[ThinkerUnitResult] = []
    specials = special_token_ids(special) | {engine.tokenizer.eos_token_id}
    marker = engine.tokenizer.encode(PREVIOUS_MARKER)
    for request in _session("long", 40, mode="context"):
        units.append(_unit(_append(engine, request)))
        session = engine._sessions["long"]
        window, kv = session.window, engine.runner.token_ids("long")
        assert len(window.units) <= WINDOW.max_units
        snapshot, num_decoded = list(session.snapshot.token_ids), len(units[-1].token_ids) - 1
        assert kv[len(kv) - num_decoded - len(snapshot): len(kv) - num_decoded] == snapshot
        assert [kv[u.start] for u in window.units] == [special.unit] * len(window.units)
        num_dropped = units[-1].unit_index + 1 - len(window.units)
        dropped_text = [t for u in units if u.unit_index < num_dropped
                        for t in u.token_ids.tolist() if t not in specials]
        assert list(window.previous) == dropped_text[-WINDOW.previous_max_tokens:]
        if window.previous:
            at = window.prefix_len - 1 - _index_from_end(kv[: window.prefix_len], marker)
            assert kv[at + len(marker): at + len(marker) + len(window.previous)] == list(
                window.previous)
    assert len(units) == 39 and len(dropped_text) > WINDOW.previous_max_tokens
    assert len(engine.runner.token_ids("long")) < 8 * 40 + 100


def _index_from_end(ids: list[int], block: list[int]) -> int:
    for start in range(len(ids) - len(block), -1, -1):
        if ids[start: start + len(block)] == block:
            return len(ids) - 1 - start
    raise AssertionError("the previous marker is not in the system context")


def test_unknown_window_mode_is_refused(engine_parts) -> None:
    engine = _engine(engine_parts)
    sink = _append(engine, next(_session("bad", 1, mode="sliding")))
    assert sink.error is not None and sink.error.code == "invalid_argument"
    assert "sliding_window_mode 'sliding'" in sink.error.message
    assert engine.num_sessions() == 0


def test_basic_window_changes_nothing_before_its_first_cut(engine_parts) -> None:
    """Same seeds, same audio: with the watermark not reached, basic equals off exactly."""
    results = []
    for mode in ("off", "basic"):
        engine = _engine(engine_parts)
        results.append([_unit(_append(engine, r)).token_ids.tolist()
                        for r in _session(mode, 12, mode=mode)])
    assert results[0] == results[1]


@pytest.mark.parametrize("max_kv_tokens,context", [(512, 512), (5000, MAX_LEN)])
def test_a_sessions_max_kv_tokens_is_its_context(engine_parts, max_kv_tokens: int, context: int) -> None:
    """START max_kv_tokens: the session's context ends there (window off), within the engine's
    reservation; a larger value is the reservation."""
    engine = _engine(engine_parts)
    error: StageError | None = None
    for request in _session("capped", TEN_MINUTES):
        sink = _append(engine, dataclasses.replace(request, max_kv_tokens=max_kv_tokens))
        if sink.error is not None:
            error = sink.error
            break
        assert engine.runner.num_tokens("capped") <= context
    assert error is not None and error.code == "context_length_exceeded"
    assert f"its context is {context} " in error.message
    assert request.seq > (context - 100) // MAX_UNIT_ROWS


def test_the_basic_window_slides_under_a_sessions_max_kv_tokens(engine_parts) -> None:
    engine = _engine(engine_parts, "basic")
    for request in _session("capped", 150):
        _unit(_append(engine, dataclasses.replace(request, max_kv_tokens=640)))
        assert engine.runner.num_tokens("capped") <= 640
    assert engine._sessions["capped"].window.position_offset > 0  # it did cut
