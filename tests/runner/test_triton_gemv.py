"""`skinny_linear` / `triton_linear` (the decode GEMV kernel) in Triton's interpreter on CPU.

Strategy: small shapes that are not multiples of any block size (N, K a few hundred) and 1, 3
and 16 rows, through both kernel paths (FMA and tensor-core `tl.dot`), with and without split-K
and bias, compared with F.linear in float64 on the same rounded inputs. The interpreter runs
float16 and float32 correctly, but not bfloat16 (its `tl.dot` on bf16 is wrong and its bf16
stores truncate), so kernel math is checked in float16 and float32; the bf16 Thinker shapes
run on a GPU in tests/runner_gpu/test_triton_gemv_gpu.py. Also: every fallback to F.linear,
and the `gemv_backend` switch on a tiny Qwen3 (a runner built with "triton" still matches).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.decoder_backbone import set_gemv_backend  # noqa: E402
from backends.runner import triton_gemv  # noqa: E402
from backends.runner.triton_gemv import (  # noqa: E402
    GemvConfig,
    heuristic_config,
    linear_for,
    skinny_linear,
    triton_linear,
)
from backends.runner.types import RunnerConfig, SamplingParams, StepInput  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONFIGS = [
    GemvConfig(32, 64),  # FMA, one K slice, a partial last K tile
    GemvConfig(8, 128, split_k=3, num_warps=8),  # FMA, split-K (a short last slice)
    GemvConfig(16, 64, use_dot=True),  # tensor cores
    GemvConfig(64, 32, split_k=2, use_dot=True),  # tensor cores, split-K
]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}  # relative to the largest |output|


def inputs(rows: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    return x, weight, bias


def reference(x, weight, bias=None) -> torch.Tensor:
    b = None if bias is None else bias.double()
    return F.linear(x.double(), weight.double(), b)


def assert_close_rel(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    assert err <= tol, f"max relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{'dot' if c.use_dot else 'fma'}"
                         f"-n{c.block_n}-k{c.block_k}-s{c.split_k}")  # fmt: skip
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.interpreter
def test_kernel_matches_linear_float32(cfg: GemvConfig, rows: int) -> None:
    x, weight, bias = inputs(rows, 200, 300, torch.float32)
    got = triton_linear(x, weight, bias, config=cfg)
    assert got.shape == (rows, 200) and got.dtype == torch.float32
    assert_close_rel(got, reference(x, weight, bias), TOL[torch.float32])


@pytest.mark.parametrize("cfg", CONFIGS[::3], ids=["fma", "dot-split"])
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.interpreter
def test_kernel_half_inputs_without_bias(cfg: GemvConfig, rows: int) -> None:
    x, weight, _ = inputs(rows, 328, 264, torch.float16, seed=rows)
    got = triton_linear(x, weight, config=cfg)
    assert got.dtype == torch.float16
    assert_close_rel(got, reference(x, weight), TOL[torch.float16])
    wide = triton_linear(x, weight, out_dtype=torch.float32, config=cfg)  # no output rounding
    assert wide.dtype == torch.float32
    assert_close_rel(wide, reference(x, weight), TOL[torch.float32])


@pytest.mark.interpreter
def test_kernel_strided_rows_and_weight_view() -> None:
    """x rows with a stride (a slice) and a weight that is a row slice of a fused weight."""
    x, fused, _ = inputs(4, 400, 136, torch.float32)
    x_wide = torch.cat([x, torch.zeros(4, 8)], dim=1)[:, :136]
    weight = fused[100:350]
    got = triton_linear(x_wide, weight, config=CONFIGS[1])
    assert_close_rel(got, reference(x, weight), TOL[torch.float32])


@pytest.mark.interpreter
def test_heuristic_config_is_used_without_a_table_entry() -> None:
    x, weight, bias = inputs(2, 96, 1088, torch.float32)
    cfg = heuristic_config(2, 96, 1088)
    assert cfg.split_k >= 1 and cfg.block_n >= 1
    got = triton_linear(x, weight, bias)
    assert_close_rel(got, reference(x, weight, bias), TOL[torch.float32])


@pytest.fixture
def no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the Triton kernel must not run here")

    monkeypatch.setattr(triton_gemv, "triton_linear", fail)


@pytest.mark.parametrize(
    "rows, dtype", [(3, torch.bfloat16), (3, torch.float16), (3, torch.float32), (17, torch.bfloat16)]
)
def test_falls_back_on_cpu_other_dtypes_and_many_rows(no_kernel: None, rows: int, dtype) -> None:
    x, weight, bias = inputs(rows, 40, 24, dtype)
    torch.testing.assert_close(skinny_linear(x, weight, bias), F.linear(x, weight, bias))
    got = skinny_linear(x, weight, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, weight).float())


def test_table_entry_none_means_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(triton_gemv.CONFIGS, (4, 40, 24), None)
    assert triton_gemv.prefers_cublas(3, 40, 24) and not triton_gemv.prefers_cublas(2, 40, 24)
    assert triton_gemv.prefers_cublas(5, 40, 24)  # untuned shapes: the kernel at <= 2 rows only
    assert triton_gemv.config_for(3, 40, 24, torch.device("cpu")) == heuristic_config(4, 40, 24)


def test_linear_for_and_switch_validation() -> None:
    assert linear_for("cublas") is F.linear and linear_for("triton") is skinny_linear
    with pytest.raises(ValueError, match="gemv backend"):
        linear_for("cutlass")
    with pytest.raises(ValueError, match="gemv_backend"):
        RunnerConfig(num_blocks=4, max_num_reqs=1, max_model_len=8, gemv_backend="cutlass")
    assert RunnerConfig(num_blocks=4, max_num_reqs=1, max_model_len=8).gemv_backend == "cublas"


@pytest.mark.interpreter
def test_runner_switch_reaches_the_model_and_keeps_tokens(make_runner, qwen3) -> None:
    """On CPU skinny_linear falls back, so a "triton" runner must decode the same tokens; the
    switch is set on the backbone by the runner and reset by the next default runner."""
    prompts = {"a": [5, 9, 11, 3], "b": [7, 2]}

    def decode(backend: str) -> list[int | None]:
        runner = make_runner(attention_backend="triton", gemv_backend=backend)
        assert qwen3.model.gemv_backend == backend
        for rid in prompts:
            runner.add_request(rid, SamplingParams())
        runner.step([StepInput(rid, ids) for rid, ids in prompts.items()])
        results = runner.step([StepInput(rid, [1]) for rid in prompts])
        return [r.token for r in results]

    try:
        assert decode("triton") == decode("cublas")
    finally:
        set_gemv_backend(qwen3, "cublas")
