"""The GEMV kernel's prologues (RMSNorm, residual add + RMSNorm, SwiGLU folded into the
matmul's loads) in Triton's interpreter on CPU, and `fused_linears`' dispatch.

Strategy: each prologue, through both kernel paths (FMA and tensor-core `tl.dot`), with and
without split-K (which a norm prologue must refuse: its scale needs the whole row), at 1, 3 and
16 rows (16 in float32 only) and shapes that no block divides, against the unfused math in float64 on the same
rounded inputs; the residual stream the kernel writes must equal the rounded sum exactly. Then
`norm_linear` / `silu_linear` with the kernel forced on CPU (its eligibility patched) against
their own fallback path (the unfused kernels + F.linear), which is what every CPU runner uses.
The interpreter's bfloat16 is broken (see test_triton_gemv.py), so math is checked in float32
and float16 here; bf16 at real shapes and inside CUDA graphs is in
tests/runner_gpu/test_gemv_prologue_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from test_triton_gemv import CONFIGS, assert_close_rel  # noqa: E402  (the sibling module's)

from backends.runner import fused_linears, gemv_configs  # noqa: E402
from backends.runner.triton_gemv import (  # noqa: E402
    ADD_NORM,
    NORM,
    SILU_MUL,
    GemvConfig,
    Prologue,
    triton_linear,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

IDS = ["fma", "fma-split", "dot", "dot-split"]
EPS = 1e-6
TOL = {torch.float32: 2e-5, torch.float16: 3e-3}  # relative to the largest |output|
N, K = 100, 300  # no block of CONFIGS divides either; the interpreter's programs grow with N
# Rows x dtype: 16 rows (the kernel's most, the FMA path's slowest in the interpreter) in
# float32 only; the dtype's loads and stores are the same code at 1 and 3 rows.
ROWS_DTYPES = pytest.mark.parametrize(
    ("rows", "dtype"),
    [(1, torch.float32), (3, torch.float32), (16, torch.float32), (1, torch.float16), (3, torch.float16)],
    ids=["1-f32", "3-f32", "16-f32", "1-f16", "3-f16"],
)


def tensors(rows: int, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    draw = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)  # noqa: E731
    return {
        "branch": draw(rows, k), "residual": draw(rows, k, scale=3.0),
        "norm_weight": draw(k, scale=0.5) + 1, "weight": draw(n, k, scale=k**-0.5),
        "bias": draw(n), "gate_up": draw(rows, 2 * k),
    }  # fmt: skip


def rms_normed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@ROWS_DTYPES
@pytest.mark.interpreter
def test_add_norm_prologue(cfg: GemvConfig, rows: int, dtype: torch.dtype) -> None:
    t = tensors(rows, N, K, dtype, seed=rows)
    stream = torch.full_like(t["residual"], float("nan"))
    prologue = Prologue(ADD_NORM, t["norm_weight"], EPS, t["residual"], stream)
    got = triton_linear(t["branch"], t["weight"], t["bias"], config=cfg, prologue=prologue)
    summed = t["branch"] + t["residual"]  # rounded to dtype, as the unfused add rounds it
    assert torch.equal(stream, summed), "the residual stream must be the rounded sum, all of it"
    ref = F.linear(rms_normed(summed, t["norm_weight"]), t["weight"].double(), t["bias"].double())
    assert got.shape == (rows, N) and got.dtype == dtype
    assert_close_rel(got, ref, TOL[dtype])


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.interpreter
def test_norm_prologue_without_residual(cfg: GemvConfig, rows: int) -> None:
    t = tensors(rows, 136, 264, torch.float32)
    prologue = Prologue(NORM, t["norm_weight"], EPS)
    got = triton_linear(t["residual"], t["weight"], None, config=cfg, prologue=prologue)
    ref = F.linear(rms_normed(t["residual"], t["norm_weight"]), t["weight"].double())
    assert_close_rel(got, ref, TOL[torch.float32])


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
@ROWS_DTYPES
@pytest.mark.interpreter
def test_silu_mul_prologue(cfg: GemvConfig, rows: int, dtype: torch.dtype) -> None:
    t = tensors(rows, N, K, dtype, seed=7 + rows)
    got = triton_linear(t["gate_up"], t["weight"], t["bias"], config=cfg, prologue=Prologue(SILU_MUL))
    gate, up = t["gate_up"].double().chunk(2, dim=-1)
    ref = F.linear(F.silu(gate) * up, t["weight"].double(), t["bias"].double())
    assert_close_rel(got, ref, TOL[dtype])


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[Prologue]:
    """Lets `fused_linears` take the kernel path on CPU tensors (the interpreter runs it) and
    records the prologue of every kernel call."""
    calls: list[Prologue] = []

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs["prologue"])  # type: ignore[arg-type]
        return triton_linear(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_linears, "kernel_takes", lambda *args, **kwargs: True)
    monkeypatch.setattr(fused_linears, "triton_linear", spy)
    return calls


@pytest.mark.parametrize("with_branch", [True, False])
@pytest.mark.interpreter
def test_norm_linear_kernel_equals_its_fallback(kernel_calls: list, with_branch: bool) -> None:
    t = tensors(2, 96, 160, torch.float32, seed=3)
    branch = t["branch"] if with_branch else None
    args = (t["residual"], t["norm_weight"], EPS, t["weight"], t["bias"])
    got, got_stream = fused_linears.norm_linear(branch, *args, "triton")
    assert [p.kind for p in kernel_calls] == [ADD_NORM if with_branch else NORM]
    want, want_stream = fused_linears.norm_linear(branch, *args, "cublas")  # unfused + F.linear
    assert len(kernel_calls) == 1
    assert torch.equal(got_stream, want_stream)
    assert (got_stream is t["residual"]) == (not with_branch)
    assert_close_rel(got, want.double(), TOL[torch.float32])


@pytest.mark.interpreter
def test_silu_linear_kernel_equals_its_fallback(kernel_calls: list) -> None:
    t = tensors(2, 96, 160, torch.float32, seed=4)
    got = fused_linears.silu_linear(t["gate_up"], t["weight"], t["bias"], "triton")
    want = fused_linears.silu_linear(t["gate_up"], t["weight"], t["bias"], "cublas")
    assert [p.kind for p in kernel_calls] == [SILU_MUL]
    assert_close_rel(got, want.double(), TOL[torch.float32])


@pytest.mark.interpreter
def test_prologue_table_decides(kernel_calls: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """A None entry (unfused measured faster) and shapes the plain table leaves to cuBLAS
    (here: an untuned shape at 3 rows) take the unfused path; an entry's config is the one the
    kernel runs with."""
    t = tensors(2, 96, 160, torch.float32, seed=5)
    args = (t["branch"], t["residual"], t["norm_weight"], EPS, t["weight"], t["bias"], "triton")
    monkeypatch.setitem(gemv_configs.PROLOGUE_CONFIGS, (2, 96, 160, ADD_NORM), None)
    fused_linears.norm_linear(*args)
    t3 = tensors(3, 96, 160, torch.float32, seed=5)
    fused_linears.norm_linear(t3["branch"], t3["residual"], t3["norm_weight"], EPS, t3["weight"],
                              None, "triton")  # fmt: skip
    assert kernel_calls == []
    cfg = GemvConfig(8, 64)
    monkeypatch.setitem(gemv_configs.PROLOGUE_CONFIGS, (2, 96, 160, ADD_NORM), cfg)
    seen: list[GemvConfig] = []
    real = gemv_configs.prologue_config
    monkeypatch.setattr(fused_linears, "prologue_config",
                        lambda *a: seen.append(real(*a)) or seen[-1])  # fmt: skip
    fused_linears.norm_linear(*args)
    assert len(kernel_calls) == 1 and seen == [cfg]


@pytest.mark.interpreter
def test_strided_inputs_take_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads x and the residual at the same offsets: a strided branch (or a
    non-contiguous gate|up) must go the unfused way even where the kernel would run."""
    monkeypatch.setattr(fused_linears, "kernel_takes", lambda *args, **kwargs: True)

    def no_kernel(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the kernel must not run for strided inputs")

    monkeypatch.setattr(fused_linears, "triton_linear", no_kernel)
    t = tensors(2, 64, 96, torch.float32)
    strided = torch.cat([t["branch"], t["branch"]], dim=1)[:, :96]
    y, stream = fused_linears.norm_linear(strided, t["residual"], t["norm_weight"], EPS,
                                          t["weight"], t["bias"], "triton")  # fmt: skip
    torch.testing.assert_close(stream, strided + t["residual"])
    assert y.shape == (2, 64)
    gate_up = torch.cat([t["gate_up"], t["gate_up"]], dim=1)[:, ::2]
    assert fused_linears.silu_linear(gate_up, t["weight"], None, "triton").shape == (2, 64)


@pytest.mark.interpreter
def test_cpu_tensors_never_reach_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_linears, "triton_linear", lambda *a, **k: pytest.fail("kernel ran"))
    t = tensors(2, 64, 96, torch.float32)
    fused_linears.norm_linear(t["branch"], t["residual"], t["norm_weight"], EPS, t["weight"],
                              t["bias"], "triton")  # fmt: skip
    fused_linears.silu_linear(t["gate_up"], t["weight"], t["bias"], "triton")


@pytest.mark.interpreter
def test_decoder_fast_path_with_folded_prologues_keeps_hidden_states(
    kernel_calls: list, make_runner, qwen3
) -> None:
    """The decoder's fast path on the Triton GEMV with the kernel forced on CPU: the 2-row
    decode step runs every layer's norm + q|k|v, norm + gate|up and SwiGLU + down as folded
    kernels (the prefill, 3+ rows, stays unfused as the table leaves it), threading the
    residual stream between them and between the layers; hidden states must match the
    unfused path's and the greedy tokens be the same."""
    fused, unfused = fused_and_unfused_steps(make_runner, qwen3, kernel_calls)
    layers = len(qwen3.model.layers)
    kinds = [p.kind for p in kernel_calls]
    assert kinds.count(SILU_MUL) == layers and kinds.count(ADD_NORM) == 2 * layers - 1
    assert kinds.count(NORM) == 1  # the first layer's input norm
    assert_same_steps(fused, unfused)


def fused_and_unfused_steps(make_runner, model, calls: list) -> tuple[list[list], list[list]]:
    """`decode_steps` on cuBLAS (which must record no call of the folded kernel into `calls`),
    then on the Triton GEMV; the model's backend is reset to cuBLAS either way."""
    from backends.models.decoder_backbone import set_gemv_backend

    try:
        unfused = decode_steps(make_runner, "cublas")
        assert calls == []
        return decode_steps(make_runner, "triton"), unfused
    finally:
        set_gemv_backend(model, "cublas")


def assert_same_steps(fused: list[list], unfused: list[list]) -> None:
    """The same greedy tokens and hidden rows within 1e-4 relative, step by step."""
    for step_fused, step_ref in zip(fused, unfused):
        assert [r.token for r in step_fused] == [r.token for r in step_ref]
        for got, ref in zip(step_fused, step_ref):
            assert_close_rel(got.hidden, ref.hidden.double(), 1e-4)


def decode_steps(make_runner, backend: str) -> list[list]:
    """A prefill of two prompts, then a decode step of both (2 rows: the folded kernels' case;
    each interpreted step is slow), on the Triton attention with `backend`'s matmuls; every
    step's hidden rows captured."""
    from backends.runner.types import SamplingParams, StepInput

    prompts = {"a": [5, 9, 11, 3], "b": [7, 2, 8]}
    runner = make_runner(attention_backend="triton", gemv_backend=backend)
    for rid in prompts:
        runner.add_request(rid, SamplingParams())
    steps = [runner.step([StepInput(rid, ids, capture_hidden=True) for rid, ids in prompts.items()])]
    steps.append(runner.step([StepInput(r.request_id, [r.token], capture_hidden=True)
                              for r in steps[-1]]))  # fmt: skip
    return steps
