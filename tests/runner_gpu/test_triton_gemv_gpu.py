"""The decode GEMV kernel on a GPU, at the Thinker's bf16 shapes, against F.linear.

Strategy: for every Thinker matmul shape (q|k|v, o, gate|up, down, LM head) and 1, 2, 4, 8, 16
rows, `skinny_linear` in bf16 must equal a float32 F.linear on the same bf16 inputs within
bf16 output rounding plus accumulation-order noise: max |error| <= 1e-2 x max |reference|
(bf16 has an 8-bit mantissa, so rounding alone is up to 0.4% of each value). The float32
output (out_dtype=float32, as the LM head uses it) must be tighter (1e-3) where the kernel
runs; `triton_linear` runs the kernel even for shapes where the table prefers cuBLAS. Then the
kernel is captured in a CUDA graph (as the runner's decode graphs capture it) and replays must
track new staged inputs exactly.
Last, a runner built with `gemv_backend="triton"` (graphed decode, tiny Qwen3 in bf16) must
match the CPU reference within the bf16 bound of test_gpu_runner.py and queue a decode step
without a host sync. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from gpu_models import runner_for  # noqa: E402
from no_sync import launch_without_host_sync  # noqa: E402

from backends.runner.triton_gemv import (  # noqa: E402
    GemvConfig,
    prefers_cublas,
    skinny_linear,
    triton_linear,
)
from backends.runner.types import SamplingParams, StepInput  # noqa: E402

pytestmark = pytest.mark.gpu

THINKER_SHAPES = {  # name -> (N, K)
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (24576, 4096),
    "down_proj": (4096, 12288),
    "lm_head": (151748, 4096),  # the released vocabulary: the last block is partial
    "lm_head_qwen3": (151936, 4096),
}
BF16_REL = 1e-2
FP32_OUT_REL = 1e-3


def max_rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module", params=list(THINKER_SHAPES), ids=list(THINKER_SHAPES))
def weight(request: pytest.FixtureRequest) -> torch.Tensor:
    n, k = THINKER_SHAPES[request.param]
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    return torch.randn(n, k, device="cuda", generator=gen).mul_(k**-0.5).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
def test_thinker_shapes_match_linear(weight: torch.Tensor, rows: int) -> None:
    x = torch.randn(rows, weight.shape[1], device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x.float(), weight.float())
    with torch.no_grad():
        got = skinny_linear(x, weight)
        wide = skinny_linear(x, weight, out_dtype=torch.float32)
    assert got.shape == (rows, weight.shape[0]) and got.dtype == torch.bfloat16
    assert max_rel(got, ref) <= BF16_REL
    # where the table prefers cuBLAS, skinny_linear is F.linear (bf16) cast to float32
    wide_bound = BF16_REL if prefers_cublas(rows, *weight.shape) else FP32_OUT_REL
    assert wide.dtype == torch.float32 and max_rel(wide, ref) <= wide_bound
    assert max_rel(F.linear(x, weight), ref) <= BF16_REL  # cuBLAS meets the same bound
    kernel = triton_linear(x, weight)  # the kernel even where the table prefers cuBLAS
    assert max_rel(kernel, ref) <= BF16_REL


@pytest.mark.parametrize("cfg", [GemvConfig(16, 256, split_k=4, use_dot=True),
                                 GemvConfig(8, 512, split_k=2, num_warps=4)])  # fmt: skip
def test_split_k_with_bias(cfg: GemvConfig) -> None:
    weight = torch.randn(4096, 12288, device="cuda").mul_(12288**-0.5).to(torch.bfloat16)
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 12288, device="cuda", dtype=torch.bfloat16)
    got = triton_linear(x, weight, bias, config=cfg)
    assert max_rel(got, F.linear(x.float(), weight.float(), bias.float())) <= BF16_REL


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("shape", ["o_proj", "down_proj", "lm_head"])
def test_cuda_graph_capture_and_replay(shape: str, rows: int) -> None:
    n, k = THINKER_SHAPES[shape]
    weight = torch.randn(n, k, device="cuda").mul_(k**-0.5).to(torch.bfloat16)
    static_x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        skinny_linear(static_x, weight)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = skinny_linear(static_x, weight)
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        with torch.no_grad():
            eager = skinny_linear(static_x, weight)
        torch.testing.assert_close(static_out, eager, atol=0, rtol=0)


def decode(runner, prompts: dict[str, list[int]], steps: int, forced=None):
    for rid in prompts:
        runner.add_request(rid, SamplingParams())
    results = [runner.step([StepInput(r, ids, capture_hidden=True) for r, ids in prompts.items()])]
    for step in range(steps):
        source = forced[step] if forced is not None else results[-1]
        results.append(runner.step(
            [StepInput(r.request_id, [r.token], capture_hidden=True) for r in source]
        ))  # fmt: skip
    return results


def test_runner_with_triton_gemv_matches_reference(cpu_model, make_gpu_model) -> None:
    prompts = {"a": list(range(1, 30)), "b": [5, 9, 11], "c": list(range(100, 113))}
    expected = decode(runner_for(cpu_model), prompts, 5)
    model = make_gpu_model(torch.bfloat16)
    runner = runner_for(model, gemv_backend="triton")
    assert runner.fast_path.graphs.is_captured and model.model.gemv_backend == "triton"
    got = decode(runner, prompts, 5, forced=expected)
    for step_ref, step_got in zip(expected, got):
        for ref, res in zip(step_ref, step_got):
            got_h, ref_h = res.hidden.double().cpu(), ref.hidden.double().cpu()
            assert float((got_h - ref_h).norm() / ref_h.norm()) < 3e-2  # as test_gpu_runner
    feed = [StepInput(r.request_id, [r.token]) for r in got[-1]]
    pending = launch_without_host_sync(runner, feed)
    assert all(r.token is not None for r in pending.wait())
