"""The Thinker engine on a GPU with chunked prefill: every step graphed, the same replies.

Strategy: two engines over one tiny random Qwen3 on CUDA (fast path, decode and mixed graphs),
one prefilling each append whole, one in chunks of the mixed graphs' 32 query rows, serve the
same sessions: a setup of ~70 rows (system text, 3 s of reference voice, the initial text) or
that setup with the first unit, then 13-row unit appends, some sessions joining while others
decode. Whole, the long prefills run eagerly (and so does everything batched beside them);
chunked, no step may run eagerly, and in float32 the tokens and the KV are the same.
Skipped without CUDA.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from backends.checkpoint.tiny_tokenizer import EOS_TOKEN, train_tiny_tokenizer  # noqa: E402
from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer  # noqa: E402
from backends.contracts.messages import ThinkerRequest  # noqa: E402
from backends.contracts.sink import ListSink  # noqa: E402
from backends.models.qwen3 import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from backends.runner.types import RunnerConfig  # noqa: E402
from backends.stages.thinker_engine import ThinkerEngine, ThinkerEngineConfig  # noqa: E402

HIDDEN = 128
UNIT = 16000


class FakeEncoder:
    """[n * 1600] samples -> [n, HIDDEN] rows by a fixed projection."""

    def __init__(self) -> None:
        self.weight = torch.randn(1600, HIDDEN, generator=torch.Generator().manual_seed(99)) * 0.05

    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples).view(10, 1600) @ self.weight

    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(samples).view(-1, 1600) @ self.weight

    def reset(self) -> None:
        pass


@pytest.fixture(scope="module")
def parts() -> tuple[Qwen3ForCausalLM, TextTokenizer, SpecialTokens]:
    tokenizer = TextTokenizer(train_tiny_tokenizer(), EOS_TOKEN)
    torch.manual_seed(7)
    config = Qwen3Config(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=32, intermediate_size=256, vocab_size=1024)
    llm = Qwen3ForCausalLM(config).eval().to("cuda")
    return llm, tokenizer, SpecialTokens.resolve(tokenizer)


def _engine(parts, chunk_rows: int) -> ThinkerEngine:
    llm, tokenizer, special = parts
    runner = RunnerConfig(num_blocks=8 * 32, max_num_reqs=8, max_model_len=512, device="cuda",
                          dtype=torch.float32, attention_backend="triton")
    config = ThinkerEngineConfig(prefill_chunk_rows=chunk_rows)
    return ThinkerEngine(llm, None, tokenizer, special, runner, config, FakeEncoder)


def _audio(num_units: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(num_units * UNIT) * 0.1).astype(np.float32)


def _session(index: int) -> list[ThinkerRequest]:
    """A forced reply to the initial text in the voice of a 3 s reference; odd sessions send
    their setup alone first."""
    rid = f"s{index}"
    first = ThinkerRequest(rid, _audio(1, index), seq=0, initial_user_text="tell me about the sea",
                           ref_audio=_audio(3, 50 + index), seed=index, reply_units=2,
                           reply_tokens_per_unit=3)
    later = [ThinkerRequest(rid, _audio(1, 10 * index + k), seq=k) for k in range(1, 4)]
    if index % 2 == 0:
        return [first] + later
    setup = dataclasses.replace(first, audio=np.zeros(0, np.float32))
    units = [dataclasses.replace(r, seq=r.seq + 1, initial_user_text="", ref_audio=np.zeros(0, np.float32))
             for r in [first] + later]
    return [setup] + units


def _serve(engine: ThinkerEngine) -> tuple[dict[str, list[list[int]]], int]:
    """Four sessions, the last two joining while the first two decode; (tokens per unit, steps
    that ran eagerly)."""
    eager = 0
    real_eager = engine.runner.fast_path._forward_eager

    def counting(*args, **kwargs):
        nonlocal eager
        eager += 1
        return real_eager(*args, **kwargs)

    engine.runner.fast_path._forward_eager = counting
    sinks: dict[str, list[ListSink]] = {}
    for index in range(4):
        for request in _session(index):
            sinks.setdefault(request.request_id, []).append(ListSink())
            engine.submit(request, sinks[request.request_id][-1])
        for _ in range(3 if index == 1 else 0):
            engine.step()  # the later sessions' long prefills land beside decodes
    for _ in range(500):
        if not engine.has_work():
            break
        engine.step()
    tokens = {}
    for rid, session_sinks in sinks.items():
        assert all(s.closed and s.error is None for s in session_sinks), rid
        tokens[rid] = [r.token_ids.tolist() for s in session_sinks for r in s.results]
    return tokens, eager


def test_chunked_prefills_run_every_step_graphed_with_the_same_tokens(parts) -> None:
    whole, chunked = _engine(parts, 0), _engine(parts, 32)
    want, eager_whole = _serve(whole)
    got, eager_chunked = _serve(chunked)
    # whole: the step of sessions 0 and 1's prefills, then that of 2 and 3 (beside decodes)
    assert (eager_whole, eager_chunked) == (2, 0)
    assert got == want
    for rid in want:
        assert chunked.runner.token_ids(rid) == whole.runner.token_ids(rid)
