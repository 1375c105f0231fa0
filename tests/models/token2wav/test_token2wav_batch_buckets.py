"""Batch buckets of Code2Wav's CUDA graphs (`batch_buckets`): a batch of n windows runs as the
graph of the next bucket, extra rows copied from the first stream's.

Strategy: on CPU the graph wrappers call their functions directly, so the same padding code
runs here. The padded rows must not change the real rows: the pooled solve and the encoder of
3 streams padded to 4 equal the unpadded passes, and a whole 3-stream decode with graphs
enabled equals eager decoding (pooled caches, cuts, final windows).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.models.token2wav import StreamWindow, Token2Wav, Token2WavConfig
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt
from backends.models.token2wav.batch_buckets import batch_bucket, pad_halves, take_halves
from backends.models.token2wav.encoder_packing import pack_encoder_inputs
from backends.models.token2wav.graphs import EncoderGraphs, PooledSolverGraphs

PAD_ATOL = 1e-5  # padding changes matmul shapes only (as in test_token2wav_graphs)


def _model() -> Token2Wav:
    model = random_token2wav(Token2WavConfig.tiny(), seed=0)
    model.enable_cache_pool(4)
    return model


def test_buckets_and_half_padding_round_trip() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 17]
    rows = torch.arange(6).reshape(6, 1)  # 2 R = 6: conditional rows 0-2, unconditional 3-5
    padded = pad_halves(rows, 4)
    assert padded.flatten().tolist() == [0, 1, 2, 0, 3, 4, 5, 3]
    assert torch.equal(take_halves(padded, 3), rows)


def test_padded_pooled_solve_of_three_streams_equals_unpadded() -> None:
    model = _model()
    voice, pool, cfm = model.prepare_voice(random_voice_prompt(0)), model.cache_pool, model.flow.decoder
    streams = [model.new_stream(voice) for _ in range(3)]
    generator = torch.Generator().manual_seed(5)
    mu = torch.randn(3, 80, 21, generator=generator)
    with torch.inference_mode():
        inputs = pool.pack(cfm, mu, [21, 13, 17], torch.randn(3, 80, generator=generator),
                           torch.zeros_like(mu), [s.cache_slot for s in streams],
                           [s.flow_cache.estimator.cnn for s in streams])
        plain = cfm.solve_pooled(inputs, pool.att)
        bucketed = PooledSolverGraphs(cfm, pool.att, pool.zero_position)(inputs)
    assert bucketed.mel.shape == plain.mel.shape and bucketed.new_kv.shape == plain.new_kv.shape
    torch.testing.assert_close(bucketed.mel, plain.mel, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(bucketed.new_kv, plain.new_kv, atol=PAD_ATOL, rtol=0)
    torch.testing.assert_close(bucketed.cnn, plain.cnn, atol=PAD_ATOL, rtol=0)


def test_padded_encoder_of_three_streams_equals_unpadded() -> None:
    model = _model()
    voice = model.prepare_voice(random_voice_prompt(0))
    encoder, embed = model.flow.encoder, model.flow.input_embedding
    codes = torch.randint(0, 6561, (3, 28), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        inputs, _ = pack_encoder_inputs(encoder.config, embed(codes), [28, 9, 28], [False, True, False],
                                        [voice.cache.encoder] * 3)
        plain = encoder.run(inputs)
        bucketed = EncoderGraphs(encoder)(inputs)
    for name in ("features", "conv2_in", "up_in", "token_kv", "mel_kv"):
        got, want = getattr(bucketed, name), getattr(plain, name)
        assert got.shape[0] == 3, name
        torch.testing.assert_close(got[tuple(slice(0, n) for n in want.shape)], want, atol=PAD_ATOL, rtol=0)


def _decode_three(model: Token2Wav) -> list[np.ndarray]:
    """Three streams; the third joins one window late, so batches mix a new stream's empty
    HiFT source cache with steady ones (and 2-row batches run as 2, 3-row ones as 4). Every
    batch holds a full 28-code window, so rows pad in batch only, never in time: a lone short
    window padded to its frame bucket is checked part by part in test_token2wav_graphs (whole
    decodes of such a window moved by 1.4e-6 to 4.6e-5 between AVX-512, AVX2 and unvectorised
    CPU kernels: the random tiny model's 10-step solve grows the last-bit differences)."""
    voice = model.prepare_voice(random_voice_prompt(0))
    rng = np.random.default_rng(1)
    plans = [[28, 28, 28, 28, 12, 0], [28, 28, 9, 28, 28, 28], [0, 28, 28, 28, 28, 20]]
    streams = [model.new_stream(voice, seed=b) for b in range(3)]
    audio: list[list[np.ndarray]] = [[] for _ in plans]
    for step in range(6):
        rows = [(b, p[step]) for b, p in enumerate(plans) if p[step]]
        last = {b: step == max(i for i, n in enumerate(plans[b]) if n) for b, _ in rows}
        windows = [StreamWindow(streams[b], rng.integers(0, 6561, n).astype(np.int32), last[b]) for b, n in rows]
        for (b, _), chunk in zip(rows, model.decode(windows)):
            audio[b].append(chunk)
    return [np.concatenate(a) for a in audio]


def test_three_stream_decoding_with_graph_buckets_equals_eager() -> None:
    eager = _decode_three(_model())
    model = _model()
    model.enable_cuda_graphs()
    graphed = _decode_three(model)
    assert model.cache_pool.num_free() == 4
    for a, b in zip(eager, graphed):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=PAD_ATOL, rtol=0)


# Graphs of other shapes vs eager, float32 convs: measured 3.4e-5 on an H200. With cuDNN's
# TF32 convs (torch's default, served) a 3-row batch run as 4 rows picks other conv algorithms
# and the audio moves by up to 2.6e-3 (-52 dBFS), as any change of batch composition does.
GPU_ATOL = 5e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_three_streams_replay_the_four_row_graphs_on_cuda() -> None:
    def cuda_model() -> Token2Wav:
        model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
        model.enable_cache_pool(4)
        return model

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        eager = _decode_three(cuda_model())
        model = cuda_model()
        model.enable_cuda_graphs()
        for _ in range(2):  # capture, then replay the same graphs
            for a, b in zip(eager, _decode_three(model)):
                np.testing.assert_allclose(a, b, atol=GPU_ATOL, rtol=0)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    pooled = model.cache_pool.solver.runner
    assert pooled.num_graphs() > 0
    rows = {key[0][0][0] for key in pooled._graphs}  # key: ((shape, dtype) of each input)
    assert 4 in rows and 3 not in rows, f"3 streams run as the 4-row graphs, captured rows {rows}"
    hift_widths = {key[1][0][1] for key in model._hift_graphs.runner._graphs}
    assert len(hift_widths) >= 1 and model._hift_graphs.runner.num_graphs() > 0


def test_hift_graphs_take_mixed_cache_lengths_and_pad_the_batch() -> None:
    from backends.models.token2wav.graphs import HiFTGraphs

    hift = _model().hift
    generator = torch.Generator().manual_seed(7)
    mel = torch.randn(3, 80, 16, generator=generator)
    noise = torch.randn(3, 480 * 16, hift.num_noise_channels(), generator=generator)
    caches = [torch.randn(n, generator=generator) for n in (0, 3840, 960)]
    with torch.inference_mode():
        want_speech, want_source = hift(mel, caches, noise)
        speech, source = HiFTGraphs(hift)(mel, caches, noise)
    assert speech.shape == want_speech.shape and source.shape == want_source.shape
    torch.testing.assert_close(source, want_source, atol=0, rtol=0)
    torch.testing.assert_close(speech, want_speech, atol=PAD_ATOL, rtol=0)
