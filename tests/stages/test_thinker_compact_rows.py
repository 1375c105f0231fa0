"""The Thinker engine on the fast path draws the same units whether its rows reach the host
whole or as summaries (RunnerConfig.compact_rows_on_cpu, Triton's interpreter on CPU): a
session answering with the reply knob and one drawing as the real weights would (boundary
draw, masks, penalty, top-k / top-p), batched together over several units. The
engine's runner must carry chunk_eos as a probe (the boundary draw reads its raw logit), and
with summaries every sampled row must have reached the policy as one."""

from __future__ import annotations

import numpy as np
import pytest
from thinker_driving import UNIT, Parts, audio_engine, run_idle, serve, tiny_audio_parts

from backends.contracts.messages import ThinkerRequest
from backends.thinker.duplex_policy import DuplexPolicy

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Triton's interpreter


@pytest.fixture(scope="module")
def parts() -> Parts:
    """One decoder layer of 2 query heads over 1 kv head: which form a row reaches the host
    in depends on neither."""
    return tiny_audio_parts(num_layers=1, num_heads=2)


def _requests() -> list[ThinkerRequest]:
    rng = np.random.default_rng(4)
    audio = [(0.1 * rng.standard_normal(UNIT)).astype(np.float32) for _ in range(2)]
    knob = dict(reply_units=2, reply_tokens_per_unit=3)
    requests = []
    for rid, extra in (("knob", knob), ("real", {})):
        requests.append(ThinkerRequest(rid, audio[0], seq=0, initial_user_text="hello there",
                                       seed=9, **extra))  # type: ignore[arg-type]
        requests += [ThinkerRequest(rid, a, seq=k + 1) for k, a in enumerate(audio[1:])]
    return requests


@pytest.mark.interpreter
def test_summaries_and_whole_rows_draw_the_same_units(parts, monkeypatch) -> None:
    forms: list[str] = []
    for method in ("before_sample", "decide_compact"):
        original = getattr(DuplexPolicy, method)

        def spy(self, row, ctx, _original=original, _name=method):
            forms.append(_name)
            return _original(self, row, ctx)

        monkeypatch.setattr(DuplexPolicy, method, spy)
    units = {}
    for mode in ("whole", "summary"):
        forms.clear()
        engine = audio_engine(parts, attention_backend="triton", compact_rows_on_cpu=mode == "summary")
        assert engine.runner.config.probe_ids == (engine.special.chunk_eos,)
        sinks = serve(engine, _requests())
        run_idle(engine)
        assert all(s.closed and s.error is None for s in sinks), [s.error for s in sinks]
        units[mode] = [[r.token_ids.tolist() for r in s.results] for s in sinks]
        expected = "before_sample" if mode == "whole" else "decide_compact"
        assert forms and set(forms) == {expected}
    assert units["summary"] == units["whole"]
    texts = [t for unit in units["summary"] for result in unit for t in result]
    assert len(texts) > 20  # real decoding happened, not only forced tokens
