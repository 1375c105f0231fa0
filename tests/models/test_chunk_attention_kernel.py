"""The encoder's split-key chunk attention (backends/models/chunk_attention_kernel.py) against
SDPA with the bool key mask it replaces, in Triton's interpreter on CPU (tests/conftest.py sets
TRITON_INTERPRET before triton is imported).

Strategy: keys and values are strided views of a working cache laid out as the graphed pass
keeps it ([rows, layers, heads, table, head_dim]); rows end at different frames inside the key
bucket, so some key splits hold no key of a row (their softmax state must weigh nothing in the
merge) and a tile is cut by a row's end. Buckets of one key tile (no split) and of several
(split, merged) are both covered, in float32 (summation order only) and bfloat16 (the
probabilities are rounded to bfloat16 before the value product, as in flash attention).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from backends.models.chunk_attention_kernel import chunk_attention, key_splits  # noqa: E402

ATOL = {torch.float32: 1e-5, torch.bfloat16: 0.0625}  # bfloat16: as the DiT kernels' bound
HEADS, HEAD_DIM, FRAMES, LAYERS = 4, 16, 50, 2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on CUDA, else interpreted
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _inputs(rows: int, keys: int, dtype: torch.dtype, seed: int, heads: int = HEADS,
            head_dim: int = HEAD_DIM):
    generator = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, rows, LAYERS, heads, keys + 30, head_dim, generator=generator)
    cache = cache.to(dtype=dtype, device=DEVICE)
    k, v = cache[0, :, 1, :, :keys], cache[1, :, 1, :, :keys]  # layer 1 of the working cache
    q = torch.randn(rows, FRAMES, heads, head_dim, generator=generator)
    return q.to(dtype=dtype, device=DEVICE).transpose(1, 2), k, v


def _reference(q, k, v, ends: torch.Tensor) -> torch.Tensor:
    q, k, v, ends = (t.cpu().float() for t in (q, k, v, ends))
    mask = (torch.arange(k.shape[2])[None, :] < ends[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("keys,ends", [(64, [50, 64]), (200, [50, 117, 200]), (200, [60])])
def test_equals_masked_sdpa(keys: int, ends: list[int], dtype: torch.dtype) -> None:
    q, k, v = _inputs(len(ends), keys, dtype, seed=keys + len(ends))
    ends_t = torch.tensor(ends, dtype=torch.int32, device=DEVICE)
    got = chunk_attention(q, k, v, ends_t)
    assert got.shape == (len(ends), FRAMES, HEADS * HEAD_DIM) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), _reference(q, k, v, ends_t), rtol=0,
                               atol=ATOL[dtype])


@pytest.mark.skipif(DEVICE != "cuda", reason="the real sizes: compiled kernels only")
@pytest.mark.parametrize("keys,ends", [(1500, [1500]), (1024, [1000]), (512, [90, 300, 512, 51])])
def test_real_sizes_on_cuda(keys: int, ends: list[int]) -> None:
    """Whisper-medium's 16 heads of 64, bfloat16, the buckets of a long conversation."""
    q, k, v = _inputs(len(ends), keys, torch.bfloat16, seed=keys, heads=16, head_dim=64)
    ends_t = torch.tensor(ends, dtype=torch.int32, device=DEVICE)
    want = _reference(q, k, v, ends_t)
    torch.testing.assert_close(chunk_attention(q, k, v, ends_t).cpu().float(), want, rtol=0,
                               atol=ATOL[torch.bfloat16])


def test_splits_fill_the_gpu_and_leave_no_split_empty() -> None:
    assert key_splits(programs=64, key_tiles=1) == 1  # one tile: nothing to split
    assert key_splits(programs=64, key_tiles=16) == 4  # one session at 1024 keys: 256 programs
    assert key_splits(programs=64, key_tiles=24) == 5  # 1500 keys: 5 x 5 tiles cover 24
    assert key_splits(programs=256, key_tiles=24) == 2
    assert key_splits(programs=512, key_tiles=24) == 1  # the GPU is busy already
    for programs in (16, 64, 128):
        for tiles in range(1, 25):
            splits = key_splits(programs, tiles)
            per_split = -(-tiles // splits)
            assert (splits - 1) * per_split < tiles  # the last split has a tile


def test_rejects_what_it_cannot_read() -> None:
    q, k, v = _inputs(2, 64, torch.float32, seed=0)
    with pytest.raises(ValueError, match="int32"):
        chunk_attention(q, k, v, torch.tensor([50, 60], device=DEVICE))
    column_major = k.transpose(2, 3).contiguous().transpose(2, 3)  # same shape, strided last axis
    with pytest.raises(ValueError, match="contiguous last axis"):
        chunk_attention(q, column_major, v, torch.tensor([50, 60], dtype=torch.int32,
                                                         device=DEVICE))


_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from backends.models.chunk_attention_kernel import _chunk_attention_kernel

for splits in (1, 4):
    strides = ["s_q_r", "s_q_h", "s_q_t", "s_k_r", "s_k_h", "s_k_l", "s_v_r", "s_v_h", "s_v_l"]
    signature = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "ends_ptr": "*i32",
                 "out_ptr": "*fp32" if splits > 1 else "*bf16", "n_frames": "i32",
                 "total_rows": "i32", "tiles_per_split": "i32", "sm_scale": "fp32",
                 **dict.fromkeys(strides, "i32")}
    constants = {"HEADS": 16, "HEAD_DIM": 64, "BLOCK_M": 16, "BLOCK_N": 64, "SPLITS": splits,
                 "IEEE": False, "DOT_F32": False}
    signature.update(dict.fromkeys(constants, "constexpr"))
    source = ASTSource(fn=_chunk_attention_kernel, signature=signature, constexprs=constants)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print("compiled")
"""


def test_compiles_for_hopper_without_a_gpu(tmp_path) -> None:
    """The kernel as the H100 / H200 run it (bfloat16, Whisper-medium's heads, split and not),
    compiled to a cubin by the wheel's ptxas: a GPU-only type or layout error shows here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
