"""The DiT's Triton GEMMs (`dit_gemm`): split-K products, the kernels that read them, and the
plain product (bias, optional tanh-GELU) that keeps a block one chain of dependent launches.

Strategy: the parts plus the bias must equal F.linear for any split of any K (uneven parts,
widths that leave masked lanes), in Triton's interpreter on CPU (tests/conftest.py) and, on
CUDA, at the served shapes in bfloat16; so must the plain kernel, and with GELU the tanh-form
F.gelu of it; a reader given the parts (`residual_norm`, `norm_mish_taps`) must compute what it
computes from the summed product; the split count and the Triton-or-cuBLAS choice follow their
row rules and switches.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.token2wav.dit_norm_kernels import norm_mish_taps, residual_norm  # noqa: E402
from backends.models.token2wav import dit_gemm  # noqa: E402
from backends.models.token2wav.dit_gemm import (  # noqa: E402
    SplitSum,
    chained,
    linear,
    linear_split,
    split_count,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _operands(rows: int, k: int, n: int, dtype: torch.dtype, device: str = "cpu"):
    gen = torch.Generator().manual_seed(rows * k + n)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    weight = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, dtype)
    return x, weight, torch.randn(n, generator=gen).to(device, dtype)


@pytest.mark.parametrize("shape", [(7, 96, 40), (70, 100, 32), (130, 64, 24)])
@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.interpreter
def test_parts_sum_to_the_linear(shape: tuple[int, int, int], parts: int) -> None:
    x, weight, bias = _operands(*shape, torch.float32)
    product = linear_split(x, weight, bias, parts)
    assert isinstance(product, SplitSum) and product.parts.shape == (parts, shape[0], shape[2])
    assert product.parts.dtype == torch.float32 and product.dtype == torch.float32
    total = product.parts.sum(0) + bias
    torch.testing.assert_close(total, F.linear(x, weight, bias), atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", [(7, 96, 40), (70, 256, 32), (130, 64, 24)])
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.interpreter
def test_triton_product_is_the_linear(shape: tuple[int, int, int], gelu: bool) -> None:
    x, weight, bias = _operands(*shape, torch.float32)
    expected = F.linear(x, weight, bias)
    if gelu:
        expected = F.gelu(expected, approximate="tanh")
    got = linear(x, weight, bias, gelu=gelu, triton_kernel=True)
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear(x, weight, bias, gelu=gelu, triton_kernel=False), expected,
                               atol=1e-6, rtol=1e-6)  # the cuBLAS / torch side of the switch


@pytest.mark.interpreter
def test_triton_product_rounds_once_to_bfloat16() -> None:
    x, weight, bias = _operands(40, 128, 48, torch.bfloat16)
    got = linear(x, weight, bias, gelu=True, triton_kernel=True)
    exact = F.gelu(F.linear(x.float(), weight.float(), bias.float()), approximate="tanh")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact, atol=1e-2, rtol=8e-3)  # bf16 half-ulp


def test_chaining_needs_pdl_and_few_rows(monkeypatch) -> None:
    x = torch.zeros(112, 8)
    assert not chained(x)  # CPU: no dependent launch, cuBLAS/torch
    monkeypatch.setattr(dit_gemm, "use_pdl", lambda device: True)
    assert chained(x) and chained(torch.zeros(dit_gemm._CHAIN_ROWS, 8))
    assert not chained(torch.zeros(dit_gemm._CHAIN_ROWS + 1, 8)) and not chained(x[:0])


def test_one_part_is_the_plain_linear() -> None:
    x, weight, bias = _operands(5, 32, 16, torch.float32)
    assert torch.equal(linear_split(x, weight, bias, 1), F.linear(x, weight, bias))
    assert linear_split(x[:0], weight, bias, 4).shape == (0, 16)  # no rows: no launch
    with pytest.raises(ValueError, match="row-contiguous"):
        linear_split(x.t().contiguous().t(), weight, bias, 2)
    with pytest.raises(ValueError, match="row-contiguous"):
        linear(x.t().contiguous().t(), weight, bias, triton_kernel=True)


def test_split_count_follows_rows() -> None:
    assert [split_count(rows, 1536) for rows in (112, 128, 129, 224, 1792)] == [4, 4, 1, 1, 1]
    assert split_count(112, 32) == 2  # never a part under 16 of K


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.interpreter
def test_readers_sum_the_parts(dtype: torch.dtype) -> None:
    frames, width = 6, 32
    x, weight, bias = _operands(2 * frames, 3 * width, width, dtype)
    product = linear_split(x, weight, bias, 3)
    summed = product.parts.sum(0) + bias.float()  # float32, as the readers see the parts
    gen = torch.Generator().manual_seed(2)
    stream = torch.randn(2 * frames, width, generator=gen).to(dtype)
    mods = torch.randn(2, 3, width, generator=gen).to(dtype)
    atol = 1e-5 if dtype == torch.float32 else 0.0625  # bfloat16: a rounding flip at most
    for got, expected in zip(residual_norm(stream, (product, mods[:, 2]), mods[:, 0], mods[:, 1], frames, 1e-6),
                             residual_norm(stream, (summed, mods[:, 2]), mods[:, 0], mods[:, 1], frames, 1e-6)):
        torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=0)
    norm = torch.nn.LayerNorm(width).to(dtype)
    taps = []
    for y in (product, summed):
        cache = torch.randn(2, 2 * width, 2, generator=torch.Generator().manual_seed(3)).to(dtype)
        tail = torch.zeros(2, 2 * width, 2, dtype=dtype)
        taps.append(norm_mish_taps(y, norm, (cache, tail, torch.tensor([6, 4]))))
    assert taps[0].dtype == dtype
    torch.testing.assert_close(taps[0].float(), taps[1].float(), atol=atol, rtol=0)
    with pytest.raises(ValueError, match="branch output"):
        residual_norm(stream[:-1], (product, mods[:, 2]), mods[:, 0], mods[:, 1], frames - 1, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("k", [1536, 2048])  # the convs over their taps, fc2
@pytest.mark.parametrize("rows", [112, 128])
def test_served_shapes_on_cuda(k: int, rows: int) -> None:
    x, weight, bias = _operands(rows, k, 512, torch.bfloat16, "cuda")
    product = linear_split(x, weight, bias)
    assert isinstance(product, SplitSum)
    expected = F.linear(x.float(), weight.float(), bias.float())
    torch.testing.assert_close(product.parts.sum(0) + bias.float(), expected, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(512, 1536, False), (512, 2048, True), (512, 512, False)])
@pytest.mark.parametrize("rows", [112, 224])
def test_plain_product_on_cuda(shape: tuple[int, int, bool], rows: int) -> None:
    """q|k|v, fc1 + GELU (and the projection unsplit) at the served shapes, launched the way a
    window launches them (with PDL on Hopper), against the float32 product."""
    k, n, gelu = shape
    x, weight, bias = _operands(rows, k, n, torch.bfloat16, "cuda")
    got = linear(x, weight, bias, gelu=gelu, triton_kernel=True)
    exact = F.linear(x.float(), weight.float(), bias.float())
    if gelu:
        exact = F.gelu(exact, approximate="tanh")
    torch.testing.assert_close(got.float(), exact, atol=2e-2, rtol=1e-2)
