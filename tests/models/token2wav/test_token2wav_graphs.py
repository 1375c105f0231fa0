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

from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig, Voice
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.models.token2wav.encoder_packing import pack_encoder_inputs, pad_encoder_inputs
from backends.models.token2wav.graphs import (
    EncoderGraphs,
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
    assert [frame_bucket(n) for n in (1, 6, 26, 50, 52, 56, 70)] == [50, 50, 50, 50, 56, 56, 70]
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


def test_padded_encoder_equals_unpadded(token2wav: Token2Wav, voice: Voice) -> None:
    """Two rows (one final, shorter) over the voice's caches, widened to a larger bucket."""
    encoder, embed = token2wav.flow.encoder, token2wav.flow.input_embedding
    codes = torch.randint(0, 6561, (2, 28), generator=torch.Generator().manual_seed(3))
    caches = [voice.cache.encoder, voice.cache.encoder]
    with torch.inference_mode():
        inputs, _ = pack_encoder_inputs(encoder.config, embed(codes), [28, 9], [False, True], caches)
        plain = encoder.run(inputs)
        padded = encoder.run(pad_encoder_inputs(inputs, 28, inputs.token_kv.shape[3] + 25,
                                                inputs.mel_kv.shape[3] + 50))
    frames = inputs.token_valid.shape[1] - inputs.token_kv.shape[3]
    torch.testing.assert_close(padded.features[:, : 2 * frames], plain.features, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.up_in[:, :, : plain.up_in.shape[2]], plain.up_in,
                               atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(padded.mel_kv[:, :, :, : 2 * frames], plain.mel_kv, atol=PAD_ATOL, rtol=0)


@pytest.mark.parametrize("plan", [([28], [False]), ([28, 9], [False, True]), ([9, 9], [True, True])])
def test_packing_at_the_bucket_equals_packing_then_widening(
        token2wav: Token2Wav, voice: Voice, plan: tuple[list[int], list[bool]]) -> None:
    """`pack_encoder_inputs(pad_to=...)` (what the graphed encoder does) gives exactly the
    tensors of a plain pack widened by `pad_encoder_inputs`, for caches of unequal lengths."""
    encoder, embed = token2wav.flow.encoder, token2wav.flow.input_embedding
    num_codes, last = plan
    codes = torch.randint(0, 6561, (len(num_codes), 28), generator=torch.Generator().manual_seed(5))
    short = voice.cache.encoder
    grown = encoder.forward_chunk(embed(codes[:1]), [28], [False], [short])[2][0]
    caches = [short, grown][: len(num_codes)]

    def pad_to(frames: int, token_cached: int, mel_cached: int) -> tuple[int, int, int]:
        return frames + 3, token_cached + 25, mel_cached + 50

    with torch.inference_mode():
        xs = embed(codes)[:, : max(num_codes)]
        plain, frames = pack_encoder_inputs(encoder.config, xs, num_codes, last, caches)
        wide = pad_encoder_inputs(plain, *pad_to(max(frames), plain.token_kv.shape[3],
                                                 plain.mel_kv.shape[3]))
        packed, _ = pack_encoder_inputs(encoder.config, xs, num_codes, last, caches, pad_to)
    for name in ("xs", "code_valid", "lookahead", "upsample", "token_kv", "token_valid", "mel_kv",
                 "mel_valid"):
        assert torch.equal(getattr(packed, name), getattr(wide, name)), name


def test_graphed_encoder_hands_the_cfm_real_frames_only(token2wav: Token2Wav, voice: Voice) -> None:
    """A short window packed at its graph bucket (25 code frames) comes back cut to its own
    mel frames, as the unpadded window: the CFM then pads it with zeros to its bucket."""
    encoder, embed = token2wav.flow.encoder, token2wav.flow.input_embedding
    codes = torch.randint(0, 6561, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        plain, frames, _ = encoder.launch_chunk(embed(codes), [9], [False], [voice.cache.encoder])
        bucketed, frames_b, _ = encoder.launch_chunk(embed(codes), [9], [False], [voice.cache.encoder],
                                                     EncoderGraphs(encoder))
    assert frames == frames_b == [12] and bucketed.shape == plain.shape == (1, 12, plain.shape[2])
    torch.testing.assert_close(bucketed, plain, atol=PAD_ATOL, rtol=0)


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


def test_graph_counts_cover_every_graphed_part() -> None:
    """The served gauges: graphs and eager CUDA calls of the encoder, the solve (dense and
    pooled) and the HiFT; nothing before graphs are enabled, nothing captured on CPU."""
    model = random_token2wav(Token2WavConfig.tiny(), seed=0)
    model.enable_cache_pool(max_streams=2)
    assert model.graph_counts() == {"cuda_graphs": 0, "graph_eager_calls": 0}
    model.enable_cuda_graphs()
    runners = [model.flow.encoder_runner.runner, model.flow.decoder.solver.runner,
               model.cache_pool.solver.runner, model._hift_graphs.runner]
    for weight, runner in enumerate(runners):
        runner.eager_calls = 10**weight
    assert model.graph_counts() == {"cuda_graphs": 0, "graph_eager_calls": 1111}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_runner_past_its_graph_budget_or_sealed_counts_eager_calls_on_cuda() -> None:
    runner = GraphRunner(lambda x: (x * 2,), max_graphs=1)
    for size in (4, 4, 8, 8):
        (out,) = runner(torch.ones(size, device="cuda"))
        assert torch.equal(out, torch.full((size,), 2.0, device="cuda"))
    assert runner.num_graphs() == 1 and runner.eager_calls == 2
    sealed = GraphRunner(lambda x: (x + 1,), max_graphs=8)
    sealed(torch.ones(4, device="cuda"))
    sealed.seal()
    for size in (4, 8):
        (out,) = sealed(torch.ones(size, device="cuda"))
        assert torch.equal(out, torch.full((size,), 2.0, device="cuda"))
    assert sealed.num_graphs() == 1 and sealed.eager_calls == 1  # 4 replays, 8 runs eagerly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_decoding_equals_eager_on_cuda() -> None:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
    voice = model.prepare_voice(random_voice_prompt(1))
    eager = _decode_twice(model, voice)
    model.enable_cuda_graphs()
    for _ in range(2):  # capture, then replay the same graphs
        for a, b in zip(eager, _decode_twice(model, voice)):
            np.testing.assert_allclose(a, b, atol=GPU_ATOL, rtol=0)
    assert model.flow.decoder.solver.runner.num_graphs() > 0


def _eager_unfused(model: Token2Wav, voice: Voice) -> list[np.ndarray]:
    model.disable_cuda_graphs()
    model.set_fused_kernels(False)
    audio = _decode_twice(model, voice)
    model.set_fused_kernels(None)
    return audio


def _gpu_model_and_voice(dtype: torch.dtype) -> tuple[Token2Wav, Voice]:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
    model.set_flow_dtype(dtype)
    return model, model.prepare_voice(random_voice_prompt(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_graphed_decoding_equals_eager_unfused_on_cuda(dtype: torch.dtype) -> None:
    """The served path (fused DiT, encoder + solve + HiFT graphs) against the torch path.
    float32: cuDNN's TF32 convs are off so both sides are float32 (GPU_ATOL); bfloat16: the
    fused kernels round once per output instead of once per op, so both bfloat16 paths are
    held to the float32 torch audio: the fused path's error (largest and mean) at most 1.5x
    the torch bfloat16 path's, plus 1e-3 (a fixed 2e-2 bound failed on 2 of 83520 samples:
    bfloat16 noise, equally far from float32 on both paths)."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        model, voice = _gpu_model_and_voice(dtype)
        eager = _eager_unfused(model, voice)
        float32 = dtype == torch.float32
        reference = eager if float32 else _eager_unfused(*_gpu_model_and_voice(torch.float32))
        model.enable_cuda_graphs()
        for _ in range(2):  # capture, then replay
            for a, b, ref in zip(eager, _decode_twice(model, voice), reference):
                if float32:
                    np.testing.assert_allclose(a, b, atol=GPU_ATOL, rtol=0)
                else:
                    _assert_no_worse_than(b, a, ref)
        assert model.flow.encoder_runner.runner.num_graphs() > 0
        assert model.flow.decoder.estimator.uses_fused_kernels(torch.zeros(1, 1, 8, device="cuda"))
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _assert_no_worse_than(fused: np.ndarray, torch_path: np.ndarray, reference: np.ndarray) -> None:
    for measure in (np.max, np.mean):
        got, bound = measure(np.abs(fused - reference)), measure(np.abs(torch_path - reference))
        assert got <= 1.5 * bound + 1e-3, (measure.__name__, got, bound)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_full_size_dit_on_cuda() -> None:
    """Full widths (512 hidden, 8 x 64 heads, 16 blocks), a steady window (50 frames, 400
    cached, 4 streams with CFG): float32 fused equals torch to 1e-3 (TF32 off everywhere);
    in bfloat16 the fused error against float32 is no worse than 1.5x the torch path's."""
    from backends.models.token2wav.config import DiTConfig
    from backends.models.token2wav.dit import DiT

    torch.backends.cudnn.allow_tf32, tf32 = False, torch.backends.cudnn.allow_tf32
    try:
        dit = DiT(DiTConfig()).cuda().eval()
        gen = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for param in dit.parameters():
                param.copy_(torch.randn(param.shape, generator=gen, device="cuda") * 0.05)
        c, rows = dit.config, 8
        valid = torch.ones(rows, 450, dtype=torch.bool, device="cuda")
        valid[1, 30:50] = False
        inputs = (torch.randn(rows, 320, 50, device="cuda", generator=gen),
                  torch.rand(rows, device="cuda", generator=gen),
                  torch.randn(c.depth, rows, 2 * c.hidden_size, 2, device="cuda", generator=gen),
                  torch.randn(c.depth, rows, c.num_heads, 400, 2 * c.head_dim, device="cuda",
                              generator=gen), valid, torch.full((rows,), 50, device="cuda"))
        results = {}
        for dtype in (torch.float32, torch.bfloat16):
            dit.to(dtype)
            cast = [t.to(dtype) if t.is_floating_point() and t.dim() > 1 else t for t in inputs]
            with torch.inference_mode():
                for fused in (False, True):
                    dit.fused = fused
                    results[dtype, fused] = [t.float() for t in dit.forward_chunk(*cast)]
            dit.float()
        reference = results[torch.float32, False]
        for a, b in zip(results[torch.float32, True], reference):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
        for fused_out, torch_out, ref in zip(results[torch.bfloat16, True],
                                             results[torch.bfloat16, False], reference):
            fused_err, torch_err = (fused_out - ref).abs().max(), (torch_out - ref).abs().max()
            assert fused_err <= 1.5 * torch_err + 1e-3, (fused_err, torch_err)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gelu_epilogue_is_the_tanh_form_on_cuda() -> None:
    """`dit_fused` relies on CUDA's `_addmm_activation(use_gelu=True)` being tanh-GELU."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, w, b = (torch.randn(*shape, device="cuda", generator=gen) for shape in ((64, 96), (128, 96), (128,)))
    torch.backends.cuda.matmul.allow_tf32, tf32 = False, torch.backends.cuda.matmul.allow_tf32
    try:
        got = torch._addmm_activation(b, x, w.t(), use_gelu=True)
        expected = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
