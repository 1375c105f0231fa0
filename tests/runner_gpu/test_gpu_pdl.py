"""Programmatic dependent launch on a GPU: overlapped launches give the stream-order bits.

Strategy (skipped without CUDA or below compute capability 9.0, where PDL is off anyway): PDL
changes when a kernel's programs start, never its math, so every result must equal the same
work launched in plain stream order (as on GPUs older than Hopper) bit for bit. A missing wait
shows up as a race: a kernel reading its input before the previous kernel finished writing it.
Two cases: a CUDA graph of a long chain of decode kernels at Thinker width (GEMVs with and
without a norm prologue and split-K, the residual norm), replayed many times, where each kernel
reads the one before it; and the fast-path runner (graphed and eager steps, attention and merge).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("needs a CUDA GPU with compute capability >= 9.0", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402
from test_gpu_runner import drive  # noqa: E402

from backends.runner import pdl  # noqa: E402
from backends.runner.gemv_configs import GemvConfig  # noqa: E402
from backends.runner.triton_gemv import ADD_NORM, Prologue, triton_linear  # noqa: E402
from backends.runner.triton_layer_ops import rms_norm  # noqa: E402

pytestmark = pytest.mark.gpu
HIDDEN, LINKS, REPLAYS = 4096, 24, 20
SPLIT_K = GemvConfig(64, 128, 4, 4, 3, True)  # partials + the split-sum kernel


def chain(x: torch.Tensor, weights: list[torch.Tensor], norm_w: torch.Tensor) -> torch.Tensor:
    """LINKS dependent steps; each kernel reads what the one before it wrote."""
    stream = x
    for i, weight in enumerate(weights):
        if i % 3 == 0:
            branch = triton_linear(stream, weight, config=SPLIT_K)
        elif i % 3 == 1:
            out = torch.empty_like(stream)
            prologue = Prologue(ADD_NORM, norm_w, 1e-6, stream, out)
            branch = triton_linear(stream, weight, prologue=prologue)
            stream = out
        else:
            branch = triton_linear(stream, weight)
        normed, stream = rms_norm(branch, norm_w, 1e-6, residual=stream)
        stream = stream + 0 * normed  # a torch kernel between PDL kernels, as in serving
    return stream


def graphed_chain(rows: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(11)
    weights = [
        (torch.randn(HIDDEN, HIDDEN, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        for _ in range(LINKS)
    ]  # fmt: skip
    norm_w = torch.rand(HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) + 0.5
    x = torch.randn(rows, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    chain(x, weights, norm_w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x, weights, norm_w)
    results = []
    for i in range(REPLAYS):
        x.copy_(torch.randn(rows, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16))
        graph.replay()
        results.append(out.clone())
    return results


def launch_in_stream_order(monkeypatch) -> None:
    """The launches of a GPU older than Hopper: no PDL, every kernel in stream order."""
    monkeypatch.setattr(pdl, "capability_major", lambda device_index: 8)
    assert not pdl.use_pdl(torch.device("cuda"))


@pytest.mark.parametrize("rows", [1, 16])
def test_graphed_kernel_chain_matches_stream_order(rows: int, monkeypatch) -> None:
    assert pdl.use_pdl(torch.device("cuda"))
    with_pdl = graphed_chain(rows)
    launch_in_stream_order(monkeypatch)
    in_order = graphed_chain(rows)
    for got, want in zip(with_pdl, in_order):
        assert torch.isfinite(want).all()
        assert torch.equal(got, want)


def test_runner_steps_match_stream_order(make_gpu_model, monkeypatch) -> None:
    prompts = {f"r{i}": list(range(3 + i, 20 + 3 * i)) for i in range(5)}
    model = make_gpu_model(torch.bfloat16)
    runs = []
    for in_order in (False, True):
        if in_order:
            launch_in_stream_order(monkeypatch)
        runs.append((drive(runner_for(model), 5, prompts),
                     drive(runner_for(model, use_cuda_graphs=False), 5, prompts)))  # fmt: skip
    for with_pdl, in_order in zip(*runs):
        for step_p, step_o in zip(with_pdl, in_order):
            for p, o in zip(step_p, step_o):
                assert p.token == o.token
                assert torch.equal(p.hidden, o.hidden)
