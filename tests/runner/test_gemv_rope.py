"""RoPE and the paged KV write folded into the q|k|v GEMV's epilogue (`gemv_rope`), in Triton's
interpreter on CPU.

Strategy: the kernel with the epilogue (norm and add+norm prologues, MHA and GQA head counts,
1 / 3 / 16 rows, a padding row with slot -1) against float64 math written here from the
definition (rotate-half RoPE at each row's position; k and v at each row's slot, every other
cache row untouched); where it must refuse (`rope_epilogue_fits`); `norm_qkv_rope`'s dispatch
against its own two-kernel fallback; and the decoder fast path with the epilogue forced on CPU
against the unfused path (hidden states and greedy tokens). The interpreter's bfloat16 is
broken, so float32 / float16 here; bf16 at the Talker's shapes and in a CUDA graph is in
tests/runner_gpu/test_gemv_prologue_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from test_gemv_prologue import EPS, assert_close_rel, assert_same_steps, fused_and_unfused_steps, rms_normed  # noqa: E402

from backends.runner import fused_linears, gemv_configs  # noqa: E402
from backends.runner.gemv_rope import RopeEpilogue, rope_epilogue_fits  # noqa: E402
from backends.runner.triton_gemv import ADD_NORM, NORM, GemvConfig, Prologue, triton_linear  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HEAD_DIM, K, PAGES, PAGE = 16, 48, 6, 4
DOT = GemvConfig(HEAD_DIM, 32, 1, 4, 1, True)  # one head per program, a partial last K tile
TOL = {torch.float32: 2e-5, torch.float16: 3e-3}


def case(rows: int, heads: int, kv_heads: int, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    n = (heads + 2 * kv_heads) * HEAD_DIM
    draw = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(dtype)  # noqa: E731
    slots = torch.randperm(PAGES * PAGE, generator=gen)[:rows].to(torch.int64)
    slots[-1] = -1 if rows > 1 else slots[-1]  # the last of several rows is padding
    cache = lambda: torch.full((PAGES, PAGE, kv_heads, HEAD_DIM), float("nan"), dtype=dtype)  # noqa: E731
    return {
        "x": draw(rows, K), "residual": draw(rows, K, scale=2.0), "norm_w": draw(K, scale=0.3) + 1,
        "weight": draw(n, K, scale=K**-0.5), "bias": draw(n),
        "rope": RopeEpilogue(torch.randint(0, 500, (rows,), generator=gen), 10_000.0 ** (
            -torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM), slots, cache(), cache(), heads),
    }  # fmt: skip


def rotated(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [rows, heads, head_dim] float64, rotate-half RoPE."""
    angle = positions.double()[:, None, None] * inv_freq.double()[None, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)


def expected(qkv: torch.Tensor, rope: RopeEpilogue) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, k rows, v rows) in float64 from the unrotated q|k|v rows."""
    rows, h, kvh = qkv.shape[0], rope.num_heads, rope.num_kv_heads
    q, k, v = qkv.split([h * HEAD_DIM, kvh * HEAD_DIM, kvh * HEAD_DIM], dim=-1)
    shape = lambda t, n: t.reshape(rows, n, HEAD_DIM)  # noqa: E731
    q, k = (rotated(shape(t, n), rope.positions, rope.inv_freq) for t, n in ((q, h), (k, kvh)))
    return q, k, shape(v, kvh)


def check_caches(rope: RopeEpilogue, k: torch.Tensor, v: torch.Tensor, tol: float) -> None:
    flat_k, flat_v = (c.reshape(-1, rope.num_kv_heads, HEAD_DIM) for c in (rope.k_cache, rope.v_cache))
    written = [int(s) for s in rope.slot_mapping if s >= 0]
    for row, slot in enumerate(int(s) for s in rope.slot_mapping):
        if slot >= 0:
            assert_close_rel(flat_k[slot], k[row], tol)
            assert_close_rel(flat_v[slot], v[row], tol)
    untouched = [r for r in range(flat_k.shape[0]) if r not in written]
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", [ADD_NORM, NORM], ids=["add_norm", "norm"])
@pytest.mark.interpreter
def test_rope_epilogue(rows: int, heads: int, kv_heads: int, dtype: torch.dtype, kind: int) -> None:
    t = case(rows, heads, kv_heads, dtype, seed=rows + heads)
    rope = t["rope"]
    if kind == ADD_NORM:
        stream = torch.empty_like(t["residual"])
        prologue = Prologue(ADD_NORM, t["norm_w"], EPS, t["residual"], stream)
        normed = rms_normed(t["x"] + t["residual"], t["norm_w"])
    else:
        prologue, normed = Prologue(NORM, t["norm_w"], EPS), rms_normed(t["x"], t["norm_w"])
    got = triton_linear(t["x"], t["weight"], t["bias"], config=DOT, prologue=prologue, rope=rope)
    qkv = F.linear(normed, t["weight"].double(), t["bias"].double())
    q, k, v = expected(qkv, rope)
    assert_close_rel(got[:, : heads * HEAD_DIM].reshape(rows, heads, HEAD_DIM), q, TOL[dtype])
    assert_close_rel(got[:, (heads + kv_heads) * HEAD_DIM :].reshape(rows, kv_heads, HEAD_DIM), v, TOL[dtype])
    check_caches(rope, k, v, TOL[dtype])


def test_the_epilogue_fits_only_one_head_per_tensor_core_program() -> None:
    rope = case(2, 2, 2, torch.float32)["rope"]
    n = 6 * HEAD_DIM
    assert rope_epilogue_fits(rope, DOT, n)
    for cfg in (GemvConfig(HEAD_DIM, 32), GemvConfig(32, 32, use_dot=True),
                GemvConfig(HEAD_DIM, 32, split_k=2, use_dot=True)):  # fmt: skip
        assert not rope_epilogue_fits(rope, cfg, n)
    assert not rope_epilogue_fits(rope, DOT, n + HEAD_DIM)  # not this q|k|v layout
    bf16_freq = RopeEpilogue(rope.positions, rope.inv_freq.half(), rope.slot_mapping,
                             rope.k_cache, rope.v_cache, rope.num_heads)  # fmt: skip
    assert not rope_epilogue_fits(bf16_freq, DOT, n)
    with pytest.raises(ValueError, match="one head per program"):
        triton_linear(torch.randn(2, K), torch.randn(n, K), config=GemvConfig(HEAD_DIM, 32), rope=rope)


@pytest.fixture
def rope_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """`fused_linears` takes the kernel path on CPU tensors with the one-head tile; records
    whether each kernel call carried the epilogue."""
    calls: list = []

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs.get("rope"))
        return triton_linear(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_linears, "kernel_takes", lambda *args, **kwargs: True)
    monkeypatch.setattr(fused_linears, "prologue_config", lambda *args: DOT)
    monkeypatch.setattr(fused_linears, "triton_linear", spy)
    return calls


@pytest.mark.interpreter
def test_norm_qkv_rope_folds_where_it_fits(rope_calls: list) -> None:
    """Folded: the query view and the caches equal the two-kernel fallback's; with a q/k norm
    it never folds."""
    def run(backend: str, qk_norm=None) -> tuple:
        t = case(3, 4, 2, torch.float32, seed=9)
        query, stream = fused_linears.norm_qkv_rope(
            t["x"], t["residual"], t["norm_w"], EPS, (t["weight"], t["bias"]), backend, t["rope"], qk_norm)
        return query, stream, t["rope"]

    folded, fallback = run("triton"), run("cublas")
    assert len(rope_calls) == 1 and rope_calls[0] is not None
    assert folded[0].shape == (3, 4, HEAD_DIM) and folded[0].stride(0) == 8 * HEAD_DIM
    assert torch.equal(folded[1], fallback[1])
    assert_close_rel(folded[0], fallback[0].double(), 1e-5)
    for cache in ("k_cache", "v_cache"):
        got, want = getattr(folded[2], cache), getattr(fallback[2], cache)
        assert torch.equal(got.isnan(), want.isnan())
        assert_close_rel(got.nan_to_num(), want.nan_to_num().double(), 1e-5)
    norm_w = torch.ones(HEAD_DIM)
    run("triton", qk_norm=(norm_w, norm_w, EPS))
    assert [c is not None for c in rope_calls] == [True, False]


@pytest.mark.interpreter
def test_decoder_fast_path_with_the_rope_epilogue_keeps_hidden_states(
    make_runner, qwen3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny Qwen3 without its q/k norm (a Llama layer, as the Talker's), the 2-row decode
    step's q|k|v on the one-head tile with the epilogue (forced on CPU), its attention reading
    the K/V the epilogue wrote: hidden states match the unfused path's and the greedy tokens
    are the same."""
    from backends.models.decoder_backbone import PagedSelfAttention

    calls: list = []

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs.get("rope"))
        return triton_linear(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PagedSelfAttention, "qk_norm_weights", lambda self: None)
    monkeypatch.setattr(fused_linears, "kernel_takes", lambda *args, **kwargs: True)
    monkeypatch.setattr(fused_linears, "triton_linear", spy)
    attn = qwen3.model.layers[0].self_attn
    n, k = attn.qkv_weights()[0].shape
    monkeypatch.setitem(gemv_configs.PROLOGUE_CONFIGS, (2, n, k, ADD_NORM), GemvConfig(HEAD_DIM, 32, 1, 4, 1, True))
    fused, unfused = fused_and_unfused_steps(make_runner, qwen3, calls)
    assert sum(c is not None for c in calls) == len(qwen3.model.layers)  # the decode's q|k|v
    assert_same_steps(fused, unfused)
