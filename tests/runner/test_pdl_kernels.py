"""The rule that keeps programmatic dependent launch correct, checked on the kernels' source.

A kernel launched with PDL may start while its predecessor in the stream still runs, so every
program must call `wait_for_inputs(PDL)` before it reads or writes a tensor another kernel
touches (backends/runner/pdl.py). The GPU test (tests/runner_gpu/test_gpu_pdl.py) can only
catch a missing wait as a race it happens to hit; this test reads every `@triton.jit` kernel
in the runner, the models' shared kernels and Code2Wav's DiT that takes a `PDL` flag and checks, in source order, that the wait comes before
any load, store, atomic or return and is not inside a branch, and that the only call before it
is the weight prefetch (weights are never written by another kernel).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[2] / "backends"
KERNEL_DIRS = (BACKENDS / "runner", BACKENDS / "models", BACKENDS / "models" / "token2wav")
MEMORY_CALLS = {"load", "store", "atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min"}
ALLOWED_BEFORE_WAIT = {"prefetch_l2", "program_id", "arange", "minimum", "maximum", "to", "cdiv"}


def _is_jit(func: ast.FunctionDef) -> bool:
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def pdl_kernels() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(p for folder in KERNEL_DIRS for p in folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_jit(node):
                if any(arg.arg == "PDL" for arg in node.args.args) and node.name != "wait_for_inputs":
                    found.append((f"{path.name}:{node.name}", node))
    return found


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_wait(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and _call_name(stmt.value) == "wait_for_inputs")  # fmt: skip


def test_the_decode_kernels_take_the_flag() -> None:
    names = {name.split(":")[1] for name, _ in pdl_kernels()}
    assert {"_skinny_kernel", "_split_sum_kernel", "_rms_norm_kernel", "_qk_norm_rope_kernel",
            "_silu_and_mul_kernel", "_paged_attention_kernel", "_merge_splits_kernel"} <= names
    assert {"_gemm_kernel", "_residual_norm_kernel", "_norm_mish_taps_kernel", "_attention_kernel",
            "merge_partials_kernel"} <= names  # the DiT block's whole chain (dit_gemm)


@pytest.mark.parametrize("kernel", [pytest.param(kernel, id=name) for name, kernel in pdl_kernels()])
def test_wait_comes_before_any_memory_access(kernel: ast.FunctionDef) -> None:
    name = kernel.name
    waits = [i for i, stmt in enumerate(kernel.body) if _is_wait(stmt)]
    assert len(waits) == 1, f"{name}: one top-level wait_for_inputs(PDL) expected"
    for stmt in kernel.body[: waits[0]]:
        assert not isinstance(stmt, (ast.If, ast.For, ast.While, ast.Return)), f"{name}: control flow before the wait"
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                called = _call_name(node)
                assert called not in MEMORY_CALLS, f"{name}: tl.{called} before the wait"
                assert called in ALLOWED_BEFORE_WAIT, f"{name}: {called}() before the wait"
