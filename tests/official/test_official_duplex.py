"""Duplex parity with the official `MiniCPMODuplex` on a checkpoint its classes wrote.

Strategy: `build_official.py`'s `ref_duplex` runs the official `prepare` / `streaming_prefill` /
`streaming_generate` (text only, greedy) on a float32 tiny checkpoint and records the prompt
(prefix ids, reference rows, suffix ids), the first unit's decision logits and every token of a
greedy run. Here our Thinker engine serves the same session from the same checkpoint: the
prompt rows are read from the session it set up, the decision logits from the row its policy
gets, the tokens from the units it answers. Three prompt cases: a session's REF_AUDIO with an
instruction ending in ".", no REF_AUDIO (the engine's default voice, which the official demo
feeds as its reference clip) with one ending in a letter, and an engine without a default
voice against `prepare(ref_audio=None)` (the `<|audio_start|><|audio_end|>` pair, nothing
between) with Chinese punctuation. The greedy run's tokens are random weights' choices: long
text units cut at the per-unit budget, after the forced listens, under the official repetition
and turn_eos penalties and the bad_token_ids mask, so one wrong rule changes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from backends.contracts.messages import DECISION_LISTEN, ThinkerRequest
from backends.contracts.sink import ListSink
from backends.runner.types import RunnerConfig, SampleContext
from backends.stages.thinker_engine import ThinkerEngine
from backends.thinker.duplex_policy import DuplexPolicy
from official_outputs import OfficialOutputs
from ours import Ours

TOLERANCE = 2e-6  # of the reference's peak: float32 on both sides
FORCED_UNITS = 3  # the builder's DUPLEX_FORCE_LISTEN
MAX_STEPS = 2000


@pytest.fixture(scope="module")
def ours(served: Callable[[str], Path]) -> Ours:
    return Ours.load(served("float32"), torch.float32)


@pytest.fixture(scope="module")
def ref(official: OfficialOutputs) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    return official.arrays("duplex"), official.values("duplex")


def _engine(ours: Ours, default_voice: np.ndarray | None) -> ThinkerEngine:
    ckpt = ours.checkpoint
    runner = RunnerConfig(num_blocks=96, max_num_reqs=2, max_model_len=1024, block_size=16,
                          dtype=torch.float32)
    return ThinkerEngine(ours.thinker.llm, ours.thinker.audio_encoder, ckpt.tokenizer,
                         ckpt.special_tokens, runner, default_voice=default_voice)


def _request(seq: int, audio: np.ndarray, **setup: Any) -> ThinkerRequest:
    return ThinkerRequest(request_id="s.e0", audio=np.ascontiguousarray(audio, np.float32),
                          seq=seq, temperature=0.0, **setup)


def _run(engine: ThinkerEngine) -> None:
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not go idle")


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> float:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: -inf entries differ"
    diff = float(np.abs(got[finite] - want[finite]).max())
    tolerance = TOLERANCE * max(float(np.abs(want[finite]).max()), 1.0)
    assert diff <= tolerance, f"{what}: max abs diff {diff:.3g} > {tolerance:.3g}"
    return diff


@pytest.mark.parametrize("case", [0, 1, 2], ids=["clip-period", "default-voice-letter", "none-cjk"])
def test_prompt_rows_and_first_decision_logits(
    ours: Ours, ref: tuple[dict[str, np.ndarray], dict[str, Any]], case: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arrays, values = ref
    instructions, kind = values["prompts"][case]
    engine = _engine(ours, arrays["default"] if kind == "default" else None)
    clip = arrays["clip"] if kind == "clip" else np.zeros(0, np.float32)
    seen: list[torch.Tensor] = []
    before_sample = DuplexPolicy.before_sample

    def recording(self: DuplexPolicy, logits: torch.Tensor, ctx: Any) -> int | None:
        seen.append(logits.detach().clone())
        return before_sample(self, logits, ctx)

    monkeypatch.setattr(DuplexPolicy, "before_sample", recording)
    sink = ListSink()
    engine.submit(_request(0, arrays["audio"][:16000], instructions=instructions, ref_audio=clip), sink)
    segments = engine._sessions["s.e0"].context  # the system context the session set up
    assert list(segments[0].token_ids) == values[f"prefix_ids{case}"]
    assert list(segments[-1].token_ids) == values[f"suffix_ids{case}"]
    injected = [s for s in segments if s.embeds is not None]
    if kind == "none":
        assert not injected and len(segments) == 2
    else:
        assert len(injected) == 1 and len(segments) == 3
        _assert_close(injected[0].embeds.float().numpy(), arrays[f"ref_rows{case}"], "reference rows")
    assert sum(len(s.token_ids) for s in segments) == values[f"prompt_len{case}"]
    _run(engine)
    assert sink.error is None and seen
    want = arrays[f"first_logits{case}"]
    _assert_close(seen[0].float().numpy(), want, "first decision logits")
    assert int(seen[0].argmax()) == int(want.argmax())


def test_greedy_units_equal_the_official_streaming_loop(
    ours: Ours, ref: tuple[dict[str, np.ndarray], dict[str, Any]]
) -> None:
    arrays, values = ref
    units = values["run_units"]
    assert len(units) >= 8
    engine = _engine(ours, None)
    sinks = [ListSink() for _ in units]
    audio = arrays["audio"]
    for i, sink in enumerate(sinks):
        setup = dict(instructions=values["prompts"][0][0], ref_audio=arrays["clip"]) if i == 0 else {}
        request = _request(i, audio[i * 16000:(i + 1) * 16000], force_listen=i < FORCED_UNITS, **setup)
        engine.submit(request, sink)
    _run(engine)
    got = []
    for sink in sinks:
        assert sink.error is None and len(sink.results) == 1
        got.append(sink.results[0])
    assert [r.token_ids.tolist() for r in got] == units
    assert [r.decision == DECISION_LISTEN for r in got] == values["run_listen"]
    assert any(not listen for listen in values["run_listen"][FORCED_UNITS:])


def test_decisions_on_official_rows_equal_the_official_decoder(
    ours: Ours, ref: tuple[dict[str, np.ndarray], dict[str, Any]]
) -> None:
    """Greedy `StreamDecoder.decode` on real decision logits changed so that one rule decides
    each: the listen scale (on the tokenizer's EOS id), the turn_eos length penalty, the
    repetition penalty dividing a negative logit, the bad_token_ids mask."""
    arrays, values = ref
    picks = values["decision_picks"]
    assert len(set(picks)) >= 3  # the rows were made to flip the decision
    for k, (row, scale, history) in enumerate(zip(arrays["decision_rows"], values["decision_scales"],
                                                  values["decision_histories"])):
        engine = _engine(ours, None)
        setup = _request(0, np.zeros(0, np.float32), listen_prob_scale=scale)
        engine.submit(setup, ListSink())
        policy = engine._sessions["s.e0"].policy
        policy.latches.history.extend(history)
        policy.begin_unit(False, [True])
        got = policy.before_sample(torch.from_numpy(row.copy()), SampleContext("s.e0", 100, []))
        assert got == picks[k], (k, scale, history)
