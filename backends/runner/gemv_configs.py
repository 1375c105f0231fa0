"""Launch configurations of the skinny decode GEMM (`backends.runner.triton_gemv`), and
which calls it takes.

Configurations come from `CONFIGS`, keyed by (row bucket, N, K) (the Thinker's shapes, filled
from `perf/bench_gemv.py --sweep` on an H200), else from `heuristic_config`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

MAX_ROWS = 16  # decode rows the kernel takes; more go to cuBLAS
LM_HEAD_VOCAB = 151748  # the released MiniCPM-o 4.5 tokenizer's vocabulary (the Thinker's LM head)


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = False  # tensor-core tl.dot over rows padded to 16, else FMA + reduce


# (row bucket, N, K) -> config; None: cuBLAS was faster, so skinny_linear calls F.linear. From
# `perf/bench_gemv.py --sweep` on an H200 (torch 2.11, Triton 3.6): FMA wins at 1-2 rows.
_FMA_N4 = GemvConfig(4, 1024, 1, 4, 1, False)
_FMA_N2 = GemvConfig(2, 2048, 1, 4, 1, False)
_FMA_N2_ST3 = GemvConfig(2, 2048, 1, 4, 3, False)
_DOT_N64 = GemvConfig(64, 256, 1, 4, 3, True)
_DOT_N64_S2 = GemvConfig(64, 256, 2, 4, 3, True)
_DOT_N64_S4 = GemvConfig(64, 128, 4, 4, 4, True)
_DOT_N128 = GemvConfig(128, 128, 1, 4, 3, True)
CONFIGS: dict[tuple[int, int, int], GemvConfig | None] = {
    (1, 6144, 4096): _FMA_N2,
    (1, 4096, 4096): _FMA_N4,
    (1, 24576, 4096): _FMA_N2_ST3,
    (1, 4096, 12288): _FMA_N4,
    (2, 6144, 4096): None,
    (2, 4096, 4096): _FMA_N2,
    (2, 24576, 4096): None,
    (2, 4096, 12288): _FMA_N2_ST3,
    (4, 6144, 4096): None,
    (4, 4096, 4096): GemvConfig(128, 128, 4, 4, 3, True),
    (4, 24576, 4096): None,
    (4, 4096, 12288): _DOT_N64_S4,
    (8, 6144, 4096): _DOT_N64,
    (8, 4096, 4096): _DOT_N64_S2,
    (8, 24576, 4096): _DOT_N128,
    (8, 4096, 12288): _DOT_N64_S4,
    (16, 6144, 4096): _DOT_N64,
    (16, 4096, 4096): GemvConfig(64, 128, 2, 4, 4, True),
    (16, 24576, 4096): _DOT_N128,
    (16, 4096, 12288): _DOT_N64_S2,
    # The LM head at the released tokenizer's vocabulary (151748) and at Qwen3-8B's own (151936):
    # the kernel masks the last block, so the tuned configuration holds for both.
    **{(rows, n, 4096): config for rows, config in (
        (1, GemvConfig(16, 512, 1, 4, 3, False)), (2, _DOT_N128), (4, _DOT_N128), (8, _DOT_N128),
        (16, _DOT_N128)) for n in (LM_HEAD_VOCAB, 151936)},
    # The Talker (Llama, hidden 768; `perf/bench_gemv.py --sweep --model talker`): the kernel
    # wins from 1 to 16 rows except gate|up at 2 rows. Its head at 8 and 16 rows: timed apart
    # (float32 out: 5.2 / 5.0 us against cuBLAS + cast 13.7 / 13.5 us); at 4 rows not timed.
    **{(1, n, k): GemvConfig(bn, bk, 1, w, st, False) for n, k, bn, bk, w, st in (
        (2304, 768, 2, 1024, 4, 1), (768, 768, 2, 1024, 4, 3), (6144, 768, 4, 1024, 4, 3),
        (768, 3072, 1, 2048, 4, 1), (6562, 768, 8, 1024, 8, 3))},
    **{(2, n, k): GemvConfig(bn, bk, 1, 4, st, False) for n, k, bn, bk, st in (
        (2304, 768, 4, 1024, 3), (768, 768, 4, 1024, 1), (768, 3072, 2, 2048, 1),
        (6562, 768, 4, 1024, 3))},
    (2, 6144, 768): None,
    (4, 768, 768): GemvConfig(2, 1024, 1, 4, 3, False),
    (4, 6144, 768): _DOT_N64,
    **{(rows, 768, 768): GemvConfig(16, 256, 1, 4, 4, True) for rows in (8, 16)},
    **{(rows, n, 768): GemvConfig(64, 128, 1, 4, 4, True) for rows in (4, 8, 16)
       for n in (2304, 6144) if (rows, n) != (4, 6144)},
    **{(rows, 768, 3072): GemvConfig(64, 128, 4, 4, 4, True) for rows in (4, 8, 16)},
    (8, 6562, 768): _DOT_N64,
    (16, 6562, 768): GemvConfig(64, 128, 1, 4, 4, True),
}  # fmt: skip


def row_bucket(rows: int) -> int:  # 1, 2, 4, 8, 16
    return triton.next_power_of_2(max(rows, 1))


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def heuristic_config(rows: int, n: int, k: int, num_sms: int = 132) -> GemvConfig:
    """A config for shapes the table lacks (e.g. the Talker's): the FMA path with two output
    columns per program up to 8 rows, else tensor cores; split-K while the grid is small."""
    if rows <= 8:
        return GemvConfig(2, min(2048, triton.next_power_of_2(k)), 1, 4, 1, False)
    split_k = 1
    while triton.cdiv(n, 16) * split_k < 2 * num_sms and k // (split_k * 2) >= 256:
        split_k *= 2
    return GemvConfig(16, 128, split_k, num_warps=4, num_stages=4, use_dot=True)


def config_for(rows: int, n: int, k: int, device: torch.device) -> GemvConfig:
    """The table's config for this shape, else the heuristic one (never None)."""
    found = CONFIGS.get((row_bucket(rows), n, k))
    if found is not None:
        return found
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    return heuristic_config(row_bucket(rows), n, k, sms)


def prefers_cublas(rows: int, n: int, k: int) -> bool:
    """Whether the table marks this shape as one where cuBLAS was faster; shapes it lacks use
    the kernel at 1-2 rows only (the heuristic config lost from 4 rows on untuned shapes)."""
    key = (row_bucket(rows), n, k)
    return CONFIGS[key] is None if key in CONFIGS else key[0] > 2


def kernel_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int | None = None) -> bool:  # fmt: skip
    """Whether the kernel can run x (whose last dimension must be `in_features`, default the
    weight's K): CUDA bf16/fp16 like the weight, no autograd, 1-16 rows, unit column strides."""
    if not (x.is_cuda and weight.is_cuda and weight.dim() == 2 and x.dim() >= 1):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    if bias is not None and (bias.dim() != 1 or not bias.is_contiguous()):
        return False
    width = weight.shape[1] if in_features is None else in_features
    rows = x.numel() // width if width else 0
    return x.shape[-1] == width and 1 <= rows <= MAX_ROWS and weight.stride(1) == 1


def kernel_eligible(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `skinny_linear` runs the kernel for x: it can, and the table does not leave the
    shape to cuBLAS."""
    if not kernel_takes(x, weight, bias):
        return False
    n, k = weight.shape
    return not prefers_cublas(x.numel() // k, n, k)


PLAIN, NORM, ADD_NORM, SILU_MUL = 0, 1, 2, 3  # what the GEMV applies to x on load (Prologue)

# (row bucket, N, K, prologue kind) -> config of the GEMV with that prologue folded in, or None:
# leave it unfused (elementwise kernel + the plain matmul), which measured faster there (a
# prologue re-reads its activation row in every program). From `perf/bench_gemv_prologue.py` on
# an H200 (torch 2.11, Triton 3.6): worth it at the Talker's K = 768 (from 4 rows on tensor cores,
# where cuBLAS ran the plain matmuls), and for the Thinker only at 1 row (q|k|v and down). A
# NORM prologue looks up the ADD_NORM entry; other shapes are fused with `config_for`'s config
# unless the plain table leaves them to cuBLAS.
_P_FMA_N2_K1024 = GemvConfig(2, 1024, 1, 4, 1, False)
PROLOGUE_CONFIGS: dict[tuple[int, int, int, int], GemvConfig | None] = {
    (1, 6144, 4096, ADD_NORM): GemvConfig(2, 2048, 1, 4, 1, False),
    (1, 24576, 4096, ADD_NORM): None,
    (1, 4096, 12288, SILU_MUL): GemvConfig(8, 1024, 1, 8, 1, False),
    **{(rows, n, k, kind): None for rows in (2, 4, 8, 16) for n, k, kind in
       ((6144, 4096, ADD_NORM), (24576, 4096, ADD_NORM), (4096, 12288, SILU_MUL))},
    (1, 2304, 768, ADD_NORM): _P_FMA_N2_K1024,
    (2, 2304, 768, ADD_NORM): _P_FMA_N2_K1024,
    (1, 6144, 768, ADD_NORM): GemvConfig(8, 512, 1, 4, 1, False),
    (2, 6144, 768, ADD_NORM): None,
    **{(rows, n, 768, ADD_NORM): _DOT_N64 for rows in (4, 8, 16) for n in (2304, 6144)},
    (1, 768, 3072, SILU_MUL): GemvConfig(2, 2048, 1, 4, 1, False),
    **{(rows, 768, 3072, SILU_MUL): None for rows in (2, 4, 8, 16)},
}  # fmt: skip


def prologue_config(
    rows: int, n: int, k: int, kind: int, device: torch.device
) -> GemvConfig | None:
    """The config to run a GEMV with prologue `kind` at, or None to leave the op unfused."""
    key = (row_bucket(rows), n, k, ADD_NORM if kind == NORM else kind)
    if key in PROLOGUE_CONFIGS:
        return PROLOGUE_CONFIGS[key]
    return None if prefers_cublas(rows, n, k) else config_for(rows, n, k, device)
