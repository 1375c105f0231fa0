"""CUDA-graph bucketing of the CFM solve and the HiFT (`graphs`).

Strategy: the padding that maps a window onto a graph's shape bucket must not change any real
frame: the padded solve is compared with the unpadded one on CPU (where the runners call the
functions directly, so the same code path runs). On CUDA (skipped here), graphed decoding is
compared with eager decoding, including a second replay of the same graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice, VoicePrompt
from backends.models.token2wav.assets import random_token2wav
from backends.models.token2wav.graphs import (
    GraphRunner,
    cache_bucket,
    frame_bucket,
    pad_solver_inputs,
)

# Padding changes matmul shapes only: float32 summation order (measured ~1e-6 on the mel).
PAD_ATOL = 1e-5
# GPU kernels of other shapes (graph buckets) vs eager: float32 rounding through the HiFT.
GPU_ATOL = 5e-4


def test_buckets() -> None:
    assert [frame_bucket(n) for n in (1, 8, 9, 50, 51, 56, 70)] == [8, 8, 16, 50, 56, 56, 70]
    assert [cache_bucket(n) for n in (0, 1, 50, 300, 301, 400)] == [0, 50, 50, 300, 350, 400]
    with pytest.raises(ValueError, match="max_graphs"):
        GraphRunner(lambda x: (x,), -1)


def test_padded_solve_equals_unpadded(token2wav: Token2Wav) -> None:
    cfm = token2wav.flow.decoder
    generator = torch.Generator().manual_seed(0)
    caches = []
    with torch.inference_mode():
        for history in (1, 2):
            cache = cfm.new_cache("cpu")
            for _ in range(history):
                mu = torch.randn(1, 80, 30, generator=generator)
                _, (cache,) = cfm.forward_chunk(mu, [30], torch.zeros(1, 80), torch.zeros_like(mu), [cache])
            caches.append(cache)
        mu = torch.randn(2, 80, 21, generator=generator)
        inputs = cfm.pack(mu, [21, 13], torch.randn(2, 80, generator=generator), torch.zeros_like(mu), caches)
        plain = cfm.solve(inputs)
        padded = cfm.solve(pad_solver_inputs(inputs, 24, 100))
    torch.testing.assert_close(padded.mel[:, :, :21], plain.mel, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.new_kv[..., :21, :], plain.new_kv, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.cnn, plain.cnn, atol=PAD_ATOL, rtol=0)


def _decode_twice(model: Token2Wav, voice: Voice) -> list[np.ndarray]:
    """Two streams over a few windows, batched: first, steady, unit-end and final windows."""
    rng = np.random.default_rng(0)
    plans = [[28, 28, 28, 12], [28, 9, 28, 28]]
    streams = [model.new_stream(voice) for _ in plans]
    audio = [[] for _ in plans]
    for step in range(4):
        windows = [StreamWindow(s, rng.integers(0, 6561, p[step]).astype(np.int32), step == 3)
                   for s, p in zip(streams, plans)]
        for row, chunk in enumerate(model.decode(windows)):
            audio[row].append(chunk)
    return [np.concatenate(a) for a in audio]


def test_enabling_graphs_on_cpu_changes_nothing(voice: Voice) -> None:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0)  # the `voice` fixture's weights
    eager = _decode_twice(model, voice)
    model.enable_cuda_graphs()
    graphed = _decode_twice(model, voice)
    model.disable_cuda_graphs()
    for a, b in zip(eager, graphed):
        np.testing.assert_allclose(a, b, atol=PAD_ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_decoding_equals_eager_on_cuda() -> None:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
    generator = torch.Generator().manual_seed(1)
    prompt = VoicePrompt(torch.randint(0, 6561, (50,), generator=generator),
                         torch.randn(100, 80, generator=generator) - 4, torch.randn(192, generator=generator))
    voice = model.prepare_voice(prompt)
    eager = _decode_twice(model, voice)
    model.enable_cuda_graphs()
    for _ in range(2):  # capture, then replay the same graphs
        for a, b in zip(eager, _decode_twice(model, voice)):
            np.testing.assert_allclose(a, b, atol=GPU_ATOL, rtol=0)
    assert model.flow.decoder.solver.runner.num_graphs() > 0
