"""Host work around Code2Wav's graphed encoder (on CUDA the GPU idles while the host prepares
the encoder's inputs, and between the encoder and the solve).

Strategy: the flow's encoder pass takes host codes and embeds and projects inside the graphed
function; it must give the features of the embedding -> encoder -> projection it replaced,
bit for bit eagerly and to padding's rounding when bucketed. The torch calls of a steady
window are counted on CPU (a TorchFunctionMode; GraphRunner calls are counted as one each,
as their contents replay from a graph on CUDA): the stretches before the encoder and between
the encoder and the solve hold no embedding, speaker normalization or cond allocation.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.models.token2wav.graphs import EncoderGraphs, GraphRunner

PAD_ATOL = 1e-5  # bucket padding changes matmul shapes only (as in test_token2wav_graphs)


def test_flow_encoder_pass_from_host_codes_equals_embedding_then_projection(
        token2wav: Token2Wav, voice: Voice) -> None:
    flow, plan = token2wav.flow, ([28, 9], [False, True])
    codes = np.random.default_rng(4).integers(0, 6561, (2, 28))
    caches = [voice.cache.encoder] * 2
    with torch.inference_mode():
        features, frames, grow = flow.encoder.launch_chunk(
            flow.input_embedding(torch.from_numpy(codes)), *plan, caches)
        expected, grown = flow.encoder_proj(features), grow()
        for run in (flow.run_encoder, EncoderGraphs(flow.encoder, run=flow.run_encoder)):
            got, got_frames, got_grow = flow.encoder.launch_chunk(codes, *plan, caches, run)
            assert got_frames == frames and got.shape == expected.shape
            exact = run == flow.run_encoder
            torch.testing.assert_close(got, expected, atol=0 if exact else PAD_ATOL, rtol=0)
            for mine, theirs in zip(got_grow(), grown):
                torch.testing.assert_close(mine.mel_kv, theirs.mel_kv, atol=0 if exact else PAD_ATOL,
                                           rtol=0)


def test_windows_without_a_prompt_share_one_zero_cond(token2wav: Token2Wav, voice: Voice) -> None:
    flow, codes = token2wav.flow, np.arange(28)[None]
    with torch.inference_mode():
        first = flow.encode(codes, [28], [False], [voice.cache.encoder])
        second = flow.encode(codes, [28], [False], [voice.cache.encoder])
    assert second.cond is first.cond and first.cond.shape == first.mu.shape
    assert not first.cond.any()


class _Calls(TorchFunctionMode):
    """Torch calls per stretch of a window: before the encoder's runner, between it and the
    solver's; a GraphRunner call counts once (its contents replay on CUDA)."""

    def __init__(self) -> None:
        super().__init__()
        self.stretches: list[Counter] = [Counter()]
        self.inside = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", str(func))
        if not self.inside and name != "__get__":  # attribute reads are not calls
            self.stretches[-1][name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def steady_model() -> tuple[Token2Wav, list]:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0)
    model.enable_cache_pool(1)
    voice = model.prepare_voice(random_voice_prompt(0))
    model.enable_cuda_graphs()
    return model, [model.new_stream(voice)]


def test_the_host_stretches_around_the_encoder_are_short(steady_model, monkeypatch) -> None:
    model, streams = steady_model
    calls, call = _Calls(), GraphRunner.__call__

    def counted(runner: GraphRunner, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        calls.inside = True
        try:
            return call(runner, *inputs)
        finally:
            calls.inside = False
            calls.stretches.append(Counter())

    monkeypatch.setattr(GraphRunner, "__call__", counted)
    rng = np.random.default_rng(0)
    with torch.inference_mode():
        for step in range(3):
            window = [StreamWindow(streams[0], rng.integers(0, 6561, 28).astype(np.int32), False)]
            calls.stretches = [Counter()]
            if step < 2:
                model.decode(window)
                continue
            with calls:
                model.decode(window)
    before, between = calls.stretches[:2]
    assert not {"embedding", "linear"} & set(before), before
    assert between["linear"] == 1 and not {"normalize", "zeros_like", "zeros"} & set(between), between
    # today's counts on CPU (each host -> device copy counted per array here): a ceiling
    assert sum(before.values()) <= 13 and sum(between.values()) <= 18, (before, between)
