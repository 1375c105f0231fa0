"""Batch-size buckets for Code2Wav's CUDA graphs: a window batch of n streams runs as the
graph of the next bucket, its extra rows copies of the first stream's, their outputs dropped.

A graph is captured per input shape. Exact batch sizes (1-8 in serving, mixed with the frame
and cache buckets) gave dozens of shapes that kept being captured under load: an H200 profile
at 32 sessions had a quarter of the Code2Wav thread's wall time in graph captures, and past
the graph budget windows ran eagerly. With a few batch buckets every shape is captured once,
at load (the Code2Wav warm-up). Copied rows are real inputs (no all-masked attention row to
make NaNs) and rows never mix in the encoder, the DiT or the HiFT, so the real rows' outputs
are those of the unpadded batch.

The DiT sees 2 R rows (conditional rows 0..R-1, then unconditional): each half is padded.
"""

from __future__ import annotations

import dataclasses

import torch

from backends.models.token2wav.cfm import PooledSolverInputs, SolverOutputs
from backends.models.token2wav.encoder_packing import EncoderInputs

BATCH_BUCKETS = (1, 2, 4, 8, 16)


def batch_bucket(rows: int) -> int:
    """The smallest bucket holding `rows` (beyond the largest: `rows` itself)."""
    return next((b for b in BATCH_BUCKETS if b >= rows), rows)


def pad_rows(tensor: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """`tensor` with its `dim` grown to `rows` by copies of its first row."""
    extra = rows - tensor.shape[dim]
    if extra <= 0:
        return tensor
    first = tensor.narrow(dim, 0, 1)
    return torch.cat([tensor, first.expand(*[extra if d == dim else -1 for d in range(tensor.dim())])], dim)


def pad_halves(tensor: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """A [2 R]-row `dim` (two halves of R) -> [2 rows], each half padded by `pad_rows`."""
    first, second = tensor.chunk(2, dim)
    return torch.cat([pad_rows(first, rows, dim), pad_rows(second, rows, dim)], dim)


def take_halves(tensor: torch.Tensor, rows: int, dim: int = 0) -> torch.Tensor:
    """Inverse of `pad_halves`: the first `rows` of each half of a padded [2 R'] `dim`."""
    half = tensor.shape[dim] // 2
    if half == rows:
        return tensor
    return torch.cat([tensor.narrow(dim, 0, rows), tensor.narrow(dim, half, rows)], dim)


def pad_pooled_batch(inputs: PooledSolverInputs, rows: int) -> PooledSolverInputs:
    """A pooled solve of R streams as one of `rows`: stream fields padded by rows, DiT-row
    fields (2 R: cnn along dim 2, the rest along dim 0) half by half."""
    if inputs.mu.shape[0] >= rows:
        return inputs
    return PooledSolverInputs(
        noise=pad_rows(inputs.noise, rows), mu=pad_rows(inputs.mu, rows),
        spks=pad_rows(inputs.spks, rows), cond=pad_rows(inputs.cond, rows),
        cnn=pad_halves(inputs.cnn, rows, 2), key_valid=pad_halves(inputs.key_valid, rows),
        num_new=pad_halves(inputs.num_new, rows), rows=pad_halves(inputs.rows, rows),
        order=pad_halves(inputs.order, rows),
    )


def unpad_solver_outputs(outputs: SolverOutputs, rows: int, frames: int) -> SolverOutputs:
    """The first `rows` streams' outputs (their first `frames` frames) of a padded solve."""
    return SolverOutputs(
        mel=outputs.mel[:rows, :, :frames],
        new_kv=take_halves(outputs.new_kv, rows, 2)[:, :, :, :, :frames],
        cnn=take_halves(outputs.cnn, rows, 2),
    )


def pad_encoder_batch(inputs: EncoderInputs, rows: int) -> EncoderInputs:
    """An encoder pass of B streams as one of `rows` (every field is batch-first)."""
    if inputs.xs.shape[0] >= rows:
        return inputs
    return EncoderInputs(*(pad_rows(getattr(inputs, f.name), rows) for f in dataclasses.fields(inputs)))
