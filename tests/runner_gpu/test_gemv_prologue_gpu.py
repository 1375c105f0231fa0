"""The GEMV kernel's prologues on a GPU, in bf16 at the Thinker's and the Talker's shapes.

Strategy: RMSNorm after a residual add, RMSNorm alone, and SwiGLU, each folded into the
matmul's loads (`triton_gemv.Prologue`), at 1-16 rows, must equal the unfused math (float32 on
the same bf16 inputs, the residual sum rounded to bf16 as the unfused add rounds it) within
the bf16 bound of test_triton_gemv_gpu.py (1e-2 of the largest |output|); the residual stream
the kernel writes must be that rounded sum bit for bit. `norm_linear` / `silu_linear` (what the
decoder's fast path calls) must track their unfused fallback within the same bound, replay in
a CUDA graph exactly as they run eagerly, and a runner on the Triton GEMV (now fused) queues a
graphed decode without a host sync (test_triton_gemv_gpu.py checks its tokens and hidden
states against the CPU reference). The q|k|v GEMV with RoPE and the KV write as its epilogue
(`gemv_rope`, the Talker's shape) must match its two-kernel fallback within the same bound and
replay in a graph as it runs eagerly. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from backends.runner.fused_linears import norm_linear, norm_qkv_rope, silu_linear  # noqa: E402
from backends.runner.gemv_rope import RopeEpilogue  # noqa: E402
from backends.runner.triton_gemv import (  # noqa: E402
    ADD_NORM,
    NORM,
    SILU_MUL,
    Prologue,
    triton_linear,
)

pytestmark = pytest.mark.gpu

SHAPES = {  # name -> (N, K) of the matmul after the prologue
    "thinker_qkv": (6144, 4096),
    "thinker_gate_up": (24576, 4096),
    "thinker_down": (4096, 12288),
    "talker_qkv": (2304, 768),
    "talker_gate_up": (6144, 768),
    "talker_down": (768, 3072),
}
NORMED = [name for name in SHAPES if not name.endswith("down")]
BF16_REL = 1e-2
EPS = 1e-6


def max_rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


def bf16(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale + shift).to(torch.bfloat16)


def normed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", NORMED)
def test_add_norm_prologue(name: str, rows: int) -> None:
    n, k = SHAPES[name]
    weight, norm_w = bf16(n, k, scale=k**-0.5), bf16(k, scale=0.1, shift=1.0)
    branch, residual = bf16(rows, k), bf16(rows, k, scale=4.0)
    stream = torch.empty_like(residual)
    prologue = Prologue(ADD_NORM, norm_w, EPS, residual, stream)
    got = triton_linear(branch, weight, prologue=prologue)
    summed = branch + residual
    assert torch.equal(stream, summed)
    assert max_rel(got, F.linear(normed(summed, norm_w), weight.float())) <= BF16_REL
    alone = triton_linear(residual, weight, prologue=Prologue(NORM, norm_w, EPS))
    assert max_rel(alone, F.linear(normed(residual, norm_w), weight.float())) <= BF16_REL


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", ["thinker_down", "talker_down"])
def test_silu_mul_prologue(name: str, rows: int) -> None:
    n, k = SHAPES[name]
    weight, bias, gate_up = bf16(n, k, scale=k**-0.5), bf16(n), bf16(rows, 2 * k)
    got = triton_linear(gate_up, weight, bias, prologue=Prologue(SILU_MUL))
    gate, up = gate_up.float().chunk(2, dim=-1)
    assert max_rel(got, F.linear(F.silu(gate) * up, weight.float(), bias.float())) <= BF16_REL


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("name", ["thinker_qkv", "talker_gate_up"])
def test_dispatch_tracks_the_unfused_path_and_replays_in_a_graph(name: str, rows: int) -> None:
    n, k = SHAPES[name]
    weight, down = bf16(n, k, scale=k**-0.5), bf16(k, n // 2, scale=(n // 2) ** -0.5)
    norm_w = bf16(k, scale=0.1, shift=1.0)
    branch, residual = bf16(rows, k), bf16(rows, k, scale=4.0)

    def layer(backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, stream = norm_linear(branch, residual, norm_w, EPS, weight, None, backend)
        return y, stream, silu_linear(y, down, None, backend)

    fused, unfused = layer("triton"), layer("cublas")
    assert torch.equal(fused[1], unfused[1])
    assert max_rel(fused[0], unfused[0].float()) <= BF16_REL
    assert max_rel(fused[2], unfused[2].float()) <= 2 * BF16_REL  # two roundings apart
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        layer("triton")  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static = layer("triton")
    for _ in range(2):
        branch.copy_(bf16(rows, k))
        graph.replay()
        with torch.no_grad():
            eager = layer("triton")
        for got, want in zip(static, eager):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def talker_rope(rows: int) -> RopeEpilogue:
    cache = lambda: torch.zeros(8, 16, 12, 64, dtype=torch.bfloat16, device="cuda")  # noqa: E731
    inv_freq = 10_000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float32, device="cuda") / 64)
    positions = torch.randint(0, 4000, (rows,), device="cuda")
    slots = torch.randperm(128, device="cuda")[:rows]
    return RopeEpilogue(positions, inv_freq, slots, cache(), cache(), 12)


@pytest.mark.parametrize("rows", [4, 8, 16])
def test_rope_epilogue_at_the_talker_qkv(rows: int) -> None:
    n, k = SHAPES["talker_qkv"]
    weight, norm_w = bf16(n, k, scale=k**-0.5), bf16(k, scale=0.1, shift=1.0)
    branch, residual = bf16(rows, k), bf16(rows, k, scale=4.0)

    def layer(backend: str, rope: RopeEpilogue) -> tuple[torch.Tensor, ...]:
        query, stream = norm_qkv_rope(branch, residual, norm_w, EPS, (weight, None), backend, rope, None)
        return query, stream, rope.k_cache, rope.v_cache

    rope = talker_rope(rows)
    fallback_rope = RopeEpilogue(rope.positions, rope.inv_freq, rope.slot_mapping,
                                 torch.zeros_like(rope.k_cache), torch.zeros_like(rope.v_cache), 12)
    fused, unfused = layer("triton", rope), layer("cublas", fallback_rope)
    assert fused[0].stride(0) == n, "the query must be the GEMV's output, not the fallback's"
    assert torch.equal(fused[1], unfused[1])
    for got, want in zip(fused[:1] + fused[2:], unfused[:1] + unfused[2:]):
        assert max_rel(got, want.float()) <= BF16_REL
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        layer("triton", rope)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static = layer("triton", rope)
    for _ in range(2):
        branch.copy_(bf16(rows, k))
        rope.positions.random_(0, 4000)
        graph.replay()
        replayed = [t.clone() for t in static]
        with torch.no_grad():
            eager = layer("triton", rope)
        for got, want in zip(replayed, eager):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
