"""The decoder fast path's matmuls with the elementwise kernel before each folded in.

`norm_linear` is RMSNorm (after the residual add before it) then a linear; `silu_linear` is
SwiGLU then a linear; `norm_qkv_rope` is `norm_linear` for a q|k|v projection followed by RoPE
and the KV write (the GEMV's epilogue where it fits, `gemv_rope`). With the Triton GEMV backend
and a shape its kernel takes (a decode step: at most 16 rows), each is one kernel
(`gemv_inputs.Prologue`) where the prologue table says that measured faster: a decode step of a
small batch is launch-bound, and this saves up to four of a layer's ten kernels. Otherwise
they are the fused elementwise kernels of `triton_layer_ops` followed by the backend's linear.
"""

from __future__ import annotations

import torch

from backends.runner.gemv_configs import GemvConfig, kernel_takes, prologue_config
from backends.runner.gemv_rope import RopeEpilogue, rope_epilogue_fits
from backends.runner.triton_gemv import (
    ADD_NORM,
    NORM,
    SILU_MUL,
    Prologue,
    linear_for,
    triton_linear,
)
from backends.runner.triton_layer_ops import qk_norm_rope_store_kv, rms_norm, silu_and_mul

QkNorm = tuple[torch.Tensor, torch.Tensor, float]  # (q weight, k weight, eps) of a q/k RMSNorm


def norm_linear(
    branch: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rmsnorm(branch + residual) * norm_weight @ weight^T (+ bias), all [rows, K] -> ([rows, N],
    the residual stream branch + residual). Without a branch the residual itself is normed
    (the first layer's input) and returned as the stream."""
    out, stream, _ = _norm_linear(branch, residual, norm_weight, eps, weight, bias, backend, None)
    return out, stream


def norm_qkv_rope(
    branch: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qkv_weight: tuple[torch.Tensor, torch.Tensor | None],
    backend: str,
    rope: RopeEpilogue,
    qk_norm: QkNorm | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_linear` for a fused q|k|v weight, then (q/k RMSNorm and) RoPE on q and k, k and v
    written into `rope`'s caches -> (query [rows, heads, head_dim], possibly a strided view;
    the residual stream). One kernel where the GEMV's epilogue fits, else two."""
    weight, bias = qkv_weight
    qkv, stream, roped = _norm_linear(branch, residual, norm_weight, eps, weight, bias, backend,
                                      rope if qk_norm is None else None)  # fmt: skip
    if roped:
        q_width = rope.num_heads * rope.head_dim
        return qkv[:, :q_width].view(qkv.shape[0], rope.num_heads, rope.head_dim), stream
    query = qk_norm_rope_store_kv(qkv, rope.positions, rope.slot_mapping, rope.inv_freq, qk_norm,
                                  rope.k_cache, rope.v_cache, rope.num_heads)  # fmt: skip
    return query, stream


def _norm_linear(
    branch: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    backend: str,
    rope: RopeEpilogue | None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """`norm_linear`, plus whether `rope`'s epilogue ran in the same kernel (only where the
    norm is folded into the GEMV and `rope_epilogue_fits` its config)."""
    source = residual if branch is None else branch
    kind = NORM if branch is None else ADD_NORM
    cfg = _fused_config(source, weight, bias, kind) if backend == "triton" else None
    if cfg is not None and _same_layout(source, residual, norm_weight):
        rope = rope if rope is not None and rope_epilogue_fits(rope, cfg, weight.shape[0]) else None
        if branch is None:
            prologue, stream = Prologue(NORM, norm_weight, eps), residual
        else:
            stream = torch.empty_like(residual)
            prologue = Prologue(ADD_NORM, norm_weight, eps, residual, stream)
        out = triton_linear(source, weight, bias, config=cfg, prologue=prologue, rope=rope)
        return out, stream, rope is not None
    if branch is None:
        normed, stream = rms_norm(residual, norm_weight, eps)
    else:
        normed, stream = rms_norm(branch, norm_weight, eps, residual=residual)
    return linear_for(backend)(normed, weight, bias), stream, False


def silu_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str
) -> torch.Tensor:
    """(silu(gate) * up) @ weight^T (+ bias); gate_up: [rows, 2K] gate columns then up."""
    cfg = _fused_config(gate_up, weight, bias, SILU_MUL) if backend == "triton" else None
    if cfg is not None and gate_up.is_contiguous():
        return triton_linear(gate_up, weight, bias, config=cfg, prologue=Prologue(SILU_MUL))
    return linear_for(backend)(silu_and_mul(gate_up), weight, bias)


def _fused_config(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kind: int
) -> GemvConfig | None:
    """The kernel config for this fused call, or None where it stays unfused: the kernel does
    not take x, or the prologue table says unfused is faster."""
    n, k = weight.shape
    width = 2 * k if kind == SILU_MUL else k
    if x.dim() != 2 or not kernel_takes(x, weight, bias, width):
        return None
    return prologue_config(x.shape[0], n, k, kind, x.device)


def _same_layout(source: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor) -> bool:
    """The kernel reads x and the residual at the same offsets: both contiguous, same shape."""
    if source.shape != residual.shape or source.dtype != residual.dtype:
        return False
    return source.is_contiguous() and residual.is_contiguous() and norm_weight.is_contiguous()
