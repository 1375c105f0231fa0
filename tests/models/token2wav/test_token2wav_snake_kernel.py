"""HiFT's fused elementwise passes (`snake_kernel`), the sync-free ISTFT and batched emission.

Strategy: on CPU the kernel runs in Triton's interpreter (tests/conftest.py) against the torch
expressions it replaces: the adds bit for bit (same float32 roundings in the same order), the
Snake within float32 rounding (numpy's sin there, not CUDA's sinf), then a whole HiFT with
`fused=True` against `fused=False`. The ISTFT rewrite and the batched emission must equal what
they replace exactly. On CUDA (tests marked gpu) the same comparisons run with the compiled
kernel, also inside the graphed HiFT and through Token2Wav decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.token2wav import StreamWindow, Token2WavConfig  # noqa: E402
from backends.models.token2wav.assets import random_token2wav, random_voice_prompt  # noqa: E402
from backends.models.token2wav.config import HiFTConfig  # noqa: E402
from backends.models.token2wav.hift import HiFTGenerator  # noqa: E402
from backends.models.token2wav.resblock import Snake  # noqa: E402
from backends.models.token2wav.snake_kernel import (  # noqa: E402
    MeanLeakyAct,
    SnakeAct,
    conv_epilogue,
)
from backends.models.token2wav.stream import (  # noqa: E402
    Token2WavStream,
    emit,
    emit_rows,
    to_host,
)

SNAKE_ATOL = 1e-5  # numpy vs torch sin on CPU, values up to ~15: measured 9.5e-7 (1 ulp)
HIFT_ATOL = 1e-5  # those roundings through the convs: measured ~1e-7 on the tiny HiFT
FRAMES = 12
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _operands(device: str = "cpu", shape: tuple[int, ...] = (2, 3, 1500)) -> dict[str, torch.Tensor]:
    """Odd sizes: 1500 columns span two kernel blocks; one alpha is zero (Snake then = x)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(*shape, generator=gen) * 3 for name in ("y", "res", "extra")}
    tensors["bias"] = torch.randn(shape[1], generator=gen)
    tensors["alpha"] = torch.rand(shape[1], generator=gen) + 0.5
    tensors["alpha"][0] = 0.0
    return {name: t.to(device) for name, t in tensors.items()}


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    module = Snake(alpha.shape[0]).to(x.device)
    with torch.no_grad():
        module.alpha.copy_(alpha)
        return module(x)


def _check_epilogue(device: str, snake_atol: float) -> None:
    t = _operands(device)
    expected_sum = t["extra"] + (t["res"] + (t["y"] + t["bias"][:, None]))
    summed, act = conv_epilogue(t["y"], t["bias"], t["res"], t["extra"], SnakeAct(t["alpha"]),
                                keep_sum=True)
    assert summed is not None and act is not None
    assert torch.equal(summed, expected_sum)
    torch.testing.assert_close(act, _snake(expected_sum, t["alpha"]), atol=snake_atol, rtol=0)
    assert torch.equal(act[:, 0], expected_sum[:, 0])  # alpha 0: sin(0) / (0 + eps) = 0
    plain, act = conv_epilogue(t["y"], act=SnakeAct(t["alpha"]))
    assert plain is None and act is not None
    torch.testing.assert_close(act, _snake(t["y"], t["alpha"]), atol=snake_atol, rtol=0)
    _, mean = conv_epilogue(t["y"], t["bias"], t["res"], act=MeanLeakyAct(3, 0.1))
    third = t["res"] + (t["y"] + t["bias"][:, None])
    assert mean is not None
    assert torch.equal(mean, F.leaky_relu(third * float(np.float32(1) / np.float32(3)), 0.1))
    torch.testing.assert_close(mean, F.leaky_relu(third / 3, 0.1), atol=1e-6, rtol=1e-6)


@pytest.mark.interpreter
def test_epilogue_matches_torch_expressions() -> None:
    _check_epilogue("cpu", SNAKE_ATOL)


def test_epilogue_rejects_bad_operands() -> None:
    t = _operands()
    with pytest.raises(ValueError, match="contiguous float32"):
        conv_epilogue(t["y"].transpose(1, 2))
    with pytest.raises(ValueError, match="does not match"):
        conv_epilogue(t["y"], residual=t["res"][:, :, :10].contiguous())


def _hift(config: HiFTConfig, device: str = "cpu") -> HiFTGenerator:
    """Random weights at a scale that keeps activations O(1); Snake alphas in [0.5, 1.5)."""
    torch.manual_seed(0)
    hift = HiFTGenerator(config).eval()
    with torch.no_grad():
        for name, param in hift.named_parameters():
            param.copy_(torch.rand_like(param) + 0.5 if "alpha" in name else torch.randn_like(param) * 0.1)
    return hift.to(device)


def _both_paths(hift: HiFTGenerator, batch: int, device: str = "cpu") -> tuple:
    gen = torch.Generator().manual_seed(1)
    mel = (torch.randn(batch, 80, FRAMES, generator=gen) * 2 - 5).to(device)
    noise = torch.randn(batch, FRAMES * 480, hift.num_noise_channels(), generator=gen).to(device)
    cache = [torch.randn(960, generator=gen).to(device) * 0.1 for _ in range(batch)]
    results = []
    with torch.inference_mode():
        for fused in (False, True):
            hift.fused = fused
            results.append(hift(mel, cache, noise))
    hift.fused = None
    return results


@pytest.mark.parametrize("kernels", [(3,), (3, 7, 11)])
@pytest.mark.interpreter
def test_fused_hift_equals_torch_hift(kernels: tuple[int, ...]) -> None:
    """One resblock per stage (tiny) and three (the mean of three, as served)."""
    config = HiFTConfig(base_channels=16, f0_cond_channels=16, resblock_kernel_sizes=kernels,
                        resblock_dilation_sizes=((1, 3, 5),) * len(kernels))
    (speech, source), (fused_speech, fused_source) = _both_paths(_hift(config), batch=2)
    assert torch.equal(source, fused_source)
    torch.testing.assert_close(fused_speech, speech, atol=HIFT_ATOL, rtol=0)


@pytest.mark.interpreter
def test_cudnn_benchmark_is_scoped_to_the_hift() -> None:
    hift = _hift(Token2WavConfig.tiny().hift)
    seen = []
    hift.conv_pre.register_forward_hook(lambda *_: seen.append(torch.backends.cudnn.benchmark))
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        _both_paths(hift, batch=1)
        hift.cudnn_benchmark = True
        _both_paths(hift, batch=1)
        assert seen == [False, False, True, True] and not torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.benchmark = saved


def test_istft_equals_torch_istft() -> None:
    hift = _hift(Token2WavConfig.tiny().hift)
    spectrum = torch.randn(3, 18, 101, generator=torch.Generator().manual_seed(2))
    magnitude = torch.exp(spectrum[:, :9]).clamp(max=100.0)
    expected = torch.istft(torch.polar(magnitude, torch.sin(spectrum[:, 9:])), 16, 4, 16,
                           window=hift.stft_window)
    assert torch.equal(hift._istft(spectrum), expected)


def _stream(tail: int) -> Token2WavStream:
    gen = torch.Generator().manual_seed(tail)
    return Token2WavStream(
        speaker=torch.ones(4), prompt_frames=0, flow_cache=None,  # type: ignore[arg-type]
        generator=torch.Generator(), mel_cache=torch.zeros(80, tail // 480),
        source_cache=torch.randn(tail, generator=gen), speech_tail=torch.randn(tail, generator=gen),
    )


@pytest.mark.parametrize("tail", [0, 3840])
def test_emit_rows_equals_emit_per_row(tail: int) -> None:
    gen = torch.Generator().manual_seed(5)
    mel, speech = torch.randn(3, 80, 58, generator=gen), torch.randn(3, 58 * 480, generator=gen)
    source, last = torch.randn(3, 58 * 480, generator=gen), [False, True, False]
    singles = [_stream(tail) for _ in last]
    expected = [emit(s, mel[j], speech[j], source[j], last[j], 8) for j, s in enumerate(singles)]
    batched = [_stream(tail) for _ in last]
    got = emit_rows(batched, mel, speech, source, last, 8)
    for a, b, s, t in zip(expected, got, singles, batched):
        assert torch.equal(a, b) and s.num_windows == t.num_windows == 1
        assert s.is_finished == t.is_finished
        for name in ("mel_cache", "source_cache", "speech_tail"):
            assert torch.equal(getattr(s, name), getattr(t, name)), name
    assert all(out.data_ptr() != speech.data_ptr() for out in got)  # never the HiFT's buffer


def test_to_host_keeps_rows() -> None:
    rows = [torch.arange(5.0), torch.zeros(0), torch.ones(3)]
    assert [a.tolist() for a in to_host(rows)] == [r.tolist() for r in rows]


def test_to_host_runs_before_wait_exactly_once() -> None:
    """`before_wait` (a decode's cache housekeeping, which must not be skipped or repeated)
    runs once per call, also for a call without rows; the rows come back unchanged."""
    calls: list[int] = []
    out = to_host([torch.arange(4.0)], before_wait=lambda: calls.append(1))
    assert calls == [1] and out[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert to_host([], before_wait=lambda: calls.append(2)) == [] and calls == [1, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_epilogue_matches_torch_on_cuda() -> None:
    """The compiled kernel: adds and the mean bit for bit; Snake uses libdevice's sinf, as
    torch does, so it is expected bit for bit too, asserted within one ulp of values < 16."""
    _check_epilogue("cuda", 2e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_full_size_hift_on_cuda() -> None:
    """Full widths (512 base channels, 3 resblocks per stage), 16 rows: fused equals torch bit
    for bit (the kernels add no roundings of their own). Random full-size weights make the
    HiFT chaotic (Snake's sin of large activations: one ulp upstream flips samples between
    +-0.99), so only equal conv results compare: the same cuDNN algorithms, as served (TF32
    on). Measured on an H200: equal with TF32 on; with it off the two paths' convs differed and
    so did the audio (max 1.98)."""
    (speech, source), (fused_speech, fused_source) = _both_paths(
        _hift(HiFTConfig(), "cuda"), batch=16, device="cuda")
    assert torch.equal(source, fused_source)
    assert torch.equal(fused_speech, speech)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_fused_hift_decoding_equals_eager_torch_hift_on_cuda() -> None:
    """Token2Wav decoding with the HiFT graphed (ISTFT included) and fused against the eager
    torch HiFT, twice (capture, then replay)."""
    model = random_token2wav(Token2WavConfig.tiny(), seed=0).cuda()
    voice = model.prepare_voice(random_voice_prompt(1))

    def decode() -> list[np.ndarray]:
        rng = np.random.default_rng(0)
        streams = [model.new_stream(voice) for _ in range(3)]
        chunks = []
        for step in range(3):
            codes = [rng.integers(0, 6561, 28).astype(np.int32) for _ in streams]
            chunks += model.decode([StreamWindow(s, c, step == 2) for s, c in zip(streams, codes)])
        return chunks

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # see test_token2wav_batch_buckets: TF32 convs differ by batch shape
    try:
        model.hift.fused = False
        eager = decode()
        model.hift.fused = None
        model.enable_cuda_graphs()
        for _ in range(2):
            for a, b in zip(eager, decode()):
                np.testing.assert_allclose(a, b, atol=5e-4, rtol=0)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    assert model._hift_graphs is not None and model._hift_graphs.runner.num_graphs() > 0
