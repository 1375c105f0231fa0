"""ThinkerEngine: many sessions on one runner, with session-scoped failures.

Strategy: a tiny random Qwen3 (built directly) with the tiny checkpoint's real tokenizer, and a
deterministic fake audio encoder (a fixed linear map of the samples) so tests stay fast; one
test runs the real streaming Whisper encoder. Batch independence compares each session run
alone against the same sessions interleaved on one engine (mixed prefill + decode steps):
tokens must be equal and hidden rows equal within float32 batching noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch
from thinker_driving import run_idle, serve

from backends.audio.encoder_model import AudioEncoderModel
from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.contracts.messages import (
    ACTION_STOP,
    DECISION_LISTEN,
    DECISION_SPEAK,
    ThinkerRequest,
    ThinkerUnitResult,
)
from backends.contracts.sink import ListSink
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from backends.models.whisper_encoder import WhisperEncoderConfig
from backends.runner.types import RunnerConfig, StepInput
from backends.stages.thinker_engine import ThinkerEngine, ThinkerEngineConfig

HIDDEN = 32
UNIT = 16000
# Rows of one session computed alone vs in a mixed batch go through different matmul shapes;
# float32 reassociation differs by ~1e-6 relative at these widths.
HIDDEN_ATOL = 1e-4


class FakeEncoder:
    """[16000] samples -> [10, HIDDEN] by a fixed projection; counts resets."""

    def __init__(self, fail_on_unit: int | None = None) -> None:
        generator = torch.Generator().manual_seed(99)
        self.weight = torch.randn(1600, HIDDEN, generator=generator)
        self.fail_on_unit = fail_on_unit
        self.num_units = 0
        self.num_resets = 0

    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        self.num_units += 1
        if self.num_units == self.fail_on_unit:
            raise RuntimeError("injected encoder failure")
        return torch.from_numpy(samples).view(10, 1600) @ self.weight

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples).view(-1, 1600) @ self.weight

    def reset(self) -> None:
        self.num_resets += 1


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)


@pytest.fixture(scope="module")
def special(tokenizer: TextTokenizer) -> SpecialTokens:
    return SpecialTokens.resolve(tokenizer)


@pytest.fixture(scope="module")
def llm(tokenizer: TextTokenizer) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, vocab_size=1024,
    )
    return Qwen3ForCausalLM(config).eval()


EngineFactory = Callable[..., ThinkerEngine]


@pytest.fixture()
def make_engine(llm, tokenizer, special) -> EngineFactory:
    def make(
        encoders: list[FakeEncoder] | None = None, max_context: int = 0, max_num_reqs: int = 4,
        prefill_chunk_rows: int = 0,
    ) -> ThinkerEngine:
        pool = list(encoders or [])
        runner = RunnerConfig(num_blocks=96, max_num_reqs=max_num_reqs, max_model_len=512)
        return ThinkerEngine(
            llm, None, tokenizer, special, runner,
            ThinkerEngineConfig(max_context_tokens=max_context, prefill_chunk_rows=prefill_chunk_rows),
            encoder_factory=lambda: pool.pop(0) if pool else FakeEncoder(),
        )

    return make


def _audio(num_units: int, seed: int, amplitude: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(num_units * UNIT) * amplitude).astype(np.float32)


def _silence(num_units: int = 1) -> np.ndarray:
    return np.zeros(num_units * UNIT, dtype=np.float32)


def _knob_session(request_id: str) -> list[ThinkerRequest]:
    """A forced two-unit reply to the initial text, user speech, then silence (a new reply)."""
    first = ThinkerRequest(
        request_id, _audio(1, 1), seq=0, initial_user_text="hello there", seed=5,
        reply_units=2, reply_tokens_per_unit=3,
    )
    later = [_audio(1, 2), _audio(1, 3), _silence(), _silence()]
    return [first] + [ThinkerRequest(request_id, a, seq=i + 1) for i, a in enumerate(later)]


def _free_session(request_id: str) -> list[ThinkerRequest]:
    """The natural policy on noise (speech-level RMS), including a two-unit append."""
    audios = [_audio(1, 10), _audio(2, 11), _audio(1, 12), _audio(1, 13)]
    return [ThinkerRequest(request_id, a, seq=i, seed=7) for i, a in enumerate(audios)]


def _units(sinks: list[ListSink]) -> list[ThinkerUnitResult]:
    for sink in sinks:
        assert sink.closed and sink.error is None, sink.error
        assert len(sink.results) == 1
    return [sink.results[0] for sink in sinks]


def _alone(make_engine: EngineFactory, requests: list[ThinkerRequest]) -> list[ThinkerUnitResult]:
    engine = make_engine()
    sinks = serve(engine, requests)
    run_idle(engine)
    return _units(sinks)


def _assert_same(got: list[ThinkerUnitResult], want: list[ThinkerUnitResult]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.decision == b.decision and a.unit_index == b.unit_index
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.tts_token_ids, b.tts_token_ids)
        np.testing.assert_allclose(a.tts_hidden, b.tts_hidden, rtol=0, atol=HIDDEN_ATOL)
        assert (a.text, a.turn_start, a.turn_end, a.segment_end) == (
            b.text, b.turn_start, b.turn_end, b.segment_end)


# ---- results -------------------------------------------------------------------------------


def test_reply_knobs_give_speak_units_with_exact_text(make_engine, special) -> None:
    units = _alone(make_engine, _knob_session("k"))
    assert [u.decision for u in units] == [
        DECISION_SPEAK, DECISION_SPEAK, DECISION_LISTEN, DECISION_SPEAK, DECISION_SPEAK]
    first, last = units[0], units[1]
    assert first.turn_start and not first.turn_end and first.segment_end
    assert len(first.tts_token_ids) == 3 and first.text
    assert not last.turn_start and last.turn_end
    assert len(last.tts_token_ids) == 4 and last.tts_token_ids[-1] == special.turn_eos
    assert last.tts_hidden.shape == (4, HIDDEN) and last.tts_hidden.dtype == np.float32
    assert units[2].tts_token_ids.size == 0 and units[2].token_ids.tolist() == [special.listen]
    assert units[3].turn_start and not units[4].turn_start and units[4].turn_end
    assert [u.unit_index for u in units] == [0, 1, 2, 3, 4]


def test_kv_holds_every_row_and_reinjects_the_terminator(make_engine, special) -> None:
    engine = make_engine()
    requests = _free_session("f")
    sinks = serve(engine, requests[:2])
    run_idle(engine)
    first, second = _units(sinks)
    kv = engine.runner.token_ids("f")
    context_rows = kv.index(special.unit)
    assert context_rows + 11 + len(first.token_ids) - 1 + 13 + 12 + len(second.token_ids) - 1 == len(kv)
    head = context_rows + 11 + len(first.token_ids) - 1
    assert kv[head : head + 3] == [int(first.token_ids[-1]), special.unit_end, special.unit]
    assert kv[head - len(first.token_ids) + 1 : head] == first.token_ids[:-1].tolist()
    assert second.unit_index == 2  # the two-unit append decides once, for its last unit
    assert all(len(u.token_ids) <= 20 for u in (first, second))


def _spied_rows(engine: ThinkerEngine, monkeypatch) -> list[dict[str, int]]:
    """Every runner step's rows per request, recorded as the engine issues them."""
    steps: list[dict[str, int]] = []
    real_launch = engine.runner.launch_step

    def spy(inputs: list[StepInput]):
        steps.append({inp.request_id: inp.num_rows for inp in inputs})
        return real_launch(inputs)

    monkeypatch.setattr(engine.runner, "launch_step", spy)
    return steps


@pytest.mark.parametrize("chunk_rows", [0, 8])  # prefills whole, or in chunks of <= 8 rows
def test_sessions_interleaved_equal_sessions_alone(make_engine, monkeypatch, chunk_rows) -> None:
    knob, free = _knob_session("k"), _free_session("f")
    want_knob, want_free = _alone(make_engine, knob), _alone(make_engine, free)
    engine = make_engine(prefill_chunk_rows=chunk_rows)
    steps = _spied_rows(engine, monkeypatch)
    sinks_knob = serve(engine, knob[:1])
    engine.step()
    sinks_free = serve(engine, free)
    sinks_knob += serve(engine, knob[1:])
    run_idle(engine)
    _assert_same(_units(sinks_knob), want_knob)
    _assert_same(_units(sinks_free), want_free)
    assert any(len(step) == 2 and min(step.values()) == 1 < max(step.values()) for step in steps), \
        "no prefill (or chunk) beside a decode"
    assert chunk_rows == 0 or all(max(step.values()) <= chunk_rows for step in steps)


# ---- stop ----------------------------------------------------------------------------------


def test_stop_frees_everything(make_engine, special) -> None:
    encoder = FakeEncoder()
    engine = make_engine([encoder])
    free_at_start = engine.runner.num_free_blocks()
    requests = _free_session("a")
    done = serve(engine, requests[:1])
    run_idle(engine)
    pending = serve(engine, requests[1:3])
    engine.step()  # the second append is now mid-flight
    engine.stop("a")
    assert engine.runner.num_free_blocks() == free_at_start
    assert not engine.runner.has_request("a") and engine.num_sessions() == 0
    assert not engine.has_work() and encoder.num_resets == 1
    assert done[0].error is None
    assert [s.error.code for s in pending] == ["cancelled", "cancelled"]
    engine.stop("a")  # idempotent
    assert encoder.num_resets == 1
    late = ListSink()
    engine.submit(requests[3], late)
    assert late.error is not None and late.error.code == "invalid_argument"


def test_stop_of_an_unknown_request_touches_nothing(make_engine) -> None:
    """Edge case 1: a stop for a request never prefilled (or unknown) must not disturb others."""
    free = _free_session("f")
    want = _alone(make_engine, free)
    engine = make_engine()
    sinks = serve(engine, free)
    engine.step()
    engine.stop("never-started")
    stop_sink = ListSink()
    engine.submit(ThinkerRequest("other", _silence(), action=ACTION_STOP), stop_sink)
    assert stop_sink.closed and stop_sink.error is None
    run_idle(engine)
    _assert_same(_units(sinks), want)


def test_stop_before_the_first_prefill_releases_the_slot(make_engine) -> None:
    engine = make_engine(max_num_reqs=1)
    first = ListSink()
    engine.submit(_free_session("a")[0], first)
    engine.stop("a")
    assert first.error.code == "cancelled" and engine.runner.num_free_blocks() == 96
    again = serve(engine, _free_session("b")[:1])
    run_idle(engine)
    assert again[0].error is None and len(again[0].results) == 1


# ---- errors --------------------------------------------------------------------------------


def _forced_listen_session(request_id: str, count: int) -> list[ThinkerRequest]:
    return [
        ThinkerRequest(request_id, _audio(1, i), seq=i, force_listen=True) for i in range(count)
    ]


def test_context_overflow_ends_the_request_once(make_engine, monkeypatch) -> None:
    """Every unit is one forced <|listen|>: KV = context + 11, then + 13 per unit. With a
    70-token context the third append (48 + 13 + 19 decode budget) no longer fits."""
    engine = make_engine(max_context=70)
    freed: list[str] = []
    real_free = engine.runner.free_request
    monkeypatch.setattr(
        engine.runner, "free_request", lambda rid: (freed.append(rid), real_free(rid)))
    other = serve(engine, _free_session("b")[:1])
    sinks = serve(engine, _forced_listen_session("a", 4))
    run_idle(engine)
    assert engine.runner.num_tokens("b") > 0
    assert [s.error for s in sinks[:2]] == [None, None]
    assert [s.error.code for s in sinks[2:]] == ["context_length_exceeded"] * 2
    assert sinks[2].error.message.startswith("context_length_exceeded")
    assert freed == ["a"]
    assert _units(other)[0].request_id == "b"
    late = ListSink()
    engine.submit(ThinkerRequest("a", _audio(1, 9), seq=9), late)
    assert late.error.code == "invalid_argument"


def test_encoder_failure_fails_only_its_session(make_engine) -> None:
    free = _free_session("f")
    want = _alone(make_engine, free)
    engine = make_engine([FakeEncoder(fail_on_unit=2), FakeEncoder()])
    broken = serve(engine, _free_session("a")[:3])
    sinks = serve(engine, free)
    run_idle(engine)
    assert broken[0].error is None
    assert [s.error.code for s in broken[1:]] == ["internal", "internal"]
    _assert_same(_units(sinks), want)
    assert not engine.runner.has_request("a")


def test_policy_failure_inside_the_runner_step_fails_only_its_session(make_engine) -> None:
    free = _free_session("f")
    want = _alone(make_engine, free)
    engine = make_engine()
    broken = serve(engine, _free_session("a")[:2])
    sinks = serve(engine, free)
    engine.step()

    def explode(*_: object) -> int:
        raise RuntimeError("injected policy failure")

    engine._sessions["a"].policy.before_sample = explode  # type: ignore[method-assign]
    run_idle(engine)
    assert any(s.error is not None and s.error.code == "internal" for s in broken)
    assert "injected policy failure" in next(s.error.message for s in broken if s.error)
    _assert_same(_units(sinks), want)


@pytest.mark.parametrize(
    ("request_kwargs", "fragment"),
    [
        (dict(audio=np.zeros(15999, dtype=np.float32)), "whole units"),
        (dict(audio=np.zeros(UNIT, dtype=np.float64)), "float32"),
        (dict(seq=3), "unknown request"),
        (dict(action="rewind"), "unknown action"),
        (dict(reply_units=2), "reply"),
    ],
)
def test_bad_requests_are_answered(make_engine, request_kwargs, fragment) -> None:
    engine = make_engine()
    fields = dict(request_id="x", audio=_silence(), seq=0) | request_kwargs
    sink = ListSink()
    engine.submit(ThinkerRequest(**fields), sink)
    assert sink.error.code == "invalid_argument" and fragment in sink.error.message
    assert engine.num_sessions() == 0 and engine.runner.num_free_blocks() == 96


def test_admission_limit(make_engine) -> None:
    engine = make_engine(max_num_reqs=1)
    serve(engine, _free_session("a")[:1])
    refused = ListSink()
    engine.submit(_free_session("b")[0], refused)
    assert refused.error.code == "resource_exhausted"


# ---- the real streaming encoder ------------------------------------------------------------


def test_real_streaming_encoder_and_reference_audio(llm, tokenizer, special) -> None:
    torch.manual_seed(3)
    whisper = WhisperEncoderConfig(
        d_model=32, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128)
    audio_model = AudioEncoderModel.from_config(whisper, HIDDEN)
    engine = ThinkerEngine(
        llm, audio_model, tokenizer, special,
        RunnerConfig(num_blocks=64, max_num_reqs=2, max_model_len=512),
    )
    first = ThinkerRequest("r", _audio(1, 1), seq=0, ref_audio=_audio(1, 4)[:4000])
    sinks = serve(engine, [first, ThinkerRequest("r", _audio(1, 2), seq=1)])
    run_idle(engine)
    units = _units(sinks)
    kv = engine.runner.token_ids("r")
    assert kv.count(special.unit) == 2 + 2  # two reference rows (4000 samples: 25 mel frames) + 2 units
    assert kv.count(special.audio) == 20 and len(units) == 2


# ---- setup append: the system context prefilled before the first unit ------------------------


def _with_setup(requests: list[ThinkerRequest]) -> list[ThinkerRequest]:
    """The same session, its setup sent alone first (seq 0, no audio), the units after."""
    first = requests[0]
    setup = dataclasses.replace(first, audio=np.zeros(0, np.float32))
    units = [dataclasses.replace(r, seq=r.seq + 1, instructions="", initial_user_text="")
             for r in requests]
    return [setup] + units


@pytest.mark.parametrize("session", [_knob_session, _free_session])
def test_a_setup_append_then_units_equals_the_setup_with_the_first_unit(make_engine, session) -> None:
    """Same rows at the same positions either way: the same tokens, handoffs and text."""
    want = _alone(make_engine, session("s"))
    engine = make_engine()
    sinks = serve(engine, _with_setup(session("s")))
    run_idle(engine)
    setup, units = sinks[0], sinks[1:]
    assert setup.closed and setup.error is None and setup.results == []  # no unit for a setup
    _assert_same(_units(units), want)


def test_the_setup_prefill_runs_before_any_unit_arrives(make_engine) -> None:
    engine = make_engine()
    setup = ListSink()
    engine.submit(ThinkerRequest("s", np.zeros(0, np.float32), seq=0, initial_user_text="hi"), setup)
    run_idle(engine)
    assert setup.closed and setup.error is None
    held = engine.runner.num_tokens("s")
    assert held > 0  # the system context is in KV, nothing sampled
    unit = ListSink()
    engine.submit(ThinkerRequest("s", _silence(), seq=1), unit)
    run_idle(engine)
    assert unit.error is None and len(unit.results) == 1
    engine.stop("s")
    assert engine.runner.num_free_blocks() == 96


def test_empty_audio_after_the_setup_append_is_refused(make_engine) -> None:
    engine = make_engine()
    sinks = serve(engine, [ThinkerRequest("s", np.zeros(0, np.float32), seq=0),
                                 ThinkerRequest("s", np.zeros(0, np.float32), seq=1)])
    run_idle(engine)
    assert sinks[0].error is None
    assert sinks[1].error.code == "invalid_argument" and "seq 1" in sinks[1].error.message
    engine.stop("s")


# ---- chunked prefill (backends/thinker/prefill_chunks.py) -------------------------------------


@pytest.mark.parametrize("session", [_knob_session, _free_session,
                                     lambda rid: _with_setup(_knob_session(rid))])
def test_chunked_prefill_equals_one_prefill(make_engine, monkeypatch, session) -> None:
    """A limit of 6 rows splits the first append (context + unit: ~20-30 rows) and every
    13-row append; the KV, tokens, handoffs and text are those of whole prefills."""
    whole = make_engine()
    want = _run_and_keep(whole, session("s"))
    engine = make_engine(prefill_chunk_rows=6)
    steps = _spied_rows(engine, monkeypatch)
    got = _run_and_keep(engine, session("s"))
    _assert_same(got, want)
    assert engine.runner.token_ids("s") == whole.runner.token_ids("s")
    rows = [step["s"] for step in steps]
    assert max(rows) <= 6 and rows.count(5) + rows.count(6) > 4  # split, evenly (13 = 5+4+4)


def _run_and_keep(engine: ThinkerEngine, requests: list[ThinkerRequest]) -> list[ThinkerUnitResult]:
    sinks = serve(engine, requests)
    run_idle(engine)
    return _units([s for s in sinks if s.results or s.error is not None])


def test_a_chunked_setup_answers_after_its_last_chunk(make_engine) -> None:
    engine = make_engine(prefill_chunk_rows=4)
    setup = ListSink()
    engine.submit(ThinkerRequest("s", np.zeros(0, np.float32), seq=0, initial_user_text="hello there"), setup)
    engine.step()
    assert not setup.closed and engine.runner.num_tokens("s") <= 4
    run_idle(engine)
    assert setup.closed and setup.error is None and setup.results == []
    whole = make_engine()
    whole.submit(ThinkerRequest("s", np.zeros(0, np.float32), seq=0, initial_user_text="hello there"),
                 ListSink())
    run_idle(whole)
    assert engine.runner.token_ids("s") == whole.runner.token_ids("s")


def test_stop_between_chunks_frees_everything(make_engine) -> None:
    engine = make_engine(prefill_chunk_rows=4)
    free_at_start = engine.runner.num_free_blocks()
    sinks = serve(engine, _knob_session("a")[:2])
    engine.step()
    engine.step()  # two chunks of the first append in KV, more to come
    assert 0 < engine.runner.num_tokens("a") <= 8 and not sinks[0].closed
    engine.stop("a")
    assert [s.error.code for s in sinks] == ["cancelled", "cancelled"]
    assert engine.runner.num_free_blocks() == free_at_start and not engine.has_work()
    again = serve(engine, _free_session("b")[:1])
    run_idle(engine)
    assert again[0].error is None and len(again[0].results) == 1
