"""The DiT attention caches of all live streams in one persistent pooled tensor.

Packing per-stream caches into a batch tensor each window, growing them by a cat and cutting them
by another (cfm.pack / unpack, cache_pruning) moved every stream's whole cache (262 MB per
bfloat16 stream at P + 100 frames) five or six times per window. Here each stream owns a slot of
`att` [steps, depth, 2 S, H, capacity + 1, 2 head_dim] for its lifetime (pool rows 2s conditional,
2s + 1 unconditional): the DiT reads a row's cache in place through (pool row, slot positions in
cache order), see `dit_attention_kernel`; after a window only the new frames are written, into
positions the cut freed, and the cut itself (docs/model_facts.md#code2wav-windows, the rule of
`cache_pruning.cut`) edits the host-side position list. The cache order, the zero padding (the
last position of every row stays zero) and hence every DiT input equal the dense path's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from backends.models.token2wav.cfm import (
    CausalConditionalCFM,
    PooledSolverInputs,
    SolverOutputs,
    rows_last,
)
from backends.models.token2wav.batching import window_first_mask_host
from backends.runner.host_staging import to_device, to_device_packed


class CachePoolFullError(RuntimeError):
    """Every slot of the pool is held by a live stream."""


@dataclass(slots=True)
class PoolSlot:
    """One stream's share of the pool (created by `EstimatorPool.acquire`)."""

    index: int  # pool rows 2 index (conditional) and 2 index + 1 (unconditional)
    prompt_frames: int  # P of the stream's voice: the cut keeps P + keep frames
    order: np.ndarray  # [L] int64 positions of the cached frames, newest first (dense layout)
    owner: object  # the pool it belongs to: a slot is never used with another pool
    released: bool = False


class EstimatorPool:
    def __init__(self, cfm: CausalConditionalCFM, max_streams: int, capacity: int,
                 keep: int) -> None:
        if max_streams < 1 or capacity < 1:
            raise ValueError(f"a cache pool needs max_streams >= 1 and capacity >= 1, got "
                             f"{max_streams} and {capacity}")
        c, e = cfm.config, cfm.config.estimator
        like = cfm.estimator.in_proj.weight
        self.att = like.new_zeros(c.n_timesteps, e.depth, 2 * max_streams, e.num_heads,
                                  capacity + 1, 2 * e.head_dim)
        self.capacity, self.keep, self.max_streams = capacity, keep, max_streams
        self._free = list(range(max_streams))  # a heap: the lowest free slot first
        self._estimator = cfm.estimator  # its `fused` switch also picks the commit's kernel
        # what runs the solve: `cfm.solve_pooled` over `att`, or its graphs (`graphs`)
        self.solver: Callable[[PooledSolverInputs], SolverOutputs] = (
            lambda inputs: cfm.solve_pooled(inputs, self.att))

    @property
    def zero_position(self) -> int:
        """A position never written: padded cache entries read zeros there."""
        return self.capacity

    def num_free(self) -> int:
        return len(self._free)

    def acquire(self, att: torch.Tensor, prompt_frames: int) -> PoolSlot:
        """att: a voice's dense cache [steps, depth, 2, H, L, 2 head_dim] -> a slot holding
        a copy of it. Raises CachePoolFullError when no slot is free."""
        if att.shape[4] > self.capacity or prompt_frames + self.keep > self.capacity:
            raise ValueError(f"a cache of {att.shape[4]} frames with prompt {prompt_frames} + "
                             f"{self.keep} does not fit the pool's {self.capacity} positions")
        if att.dtype != self.att.dtype or att.device != self.att.device:
            raise ValueError(f"a {att.dtype} cache on {att.device} for a {self.att.dtype} pool on "
                             f"{self.att.device}: enable the pool after moving and casting the flow")
        if not self._free:
            raise CachePoolFullError(f"code2wav cache pool full: all {self.max_streams} "
                                     f"stream slots are in use")
        index = heapq.heappop(self._free)
        self.att[:, :, 2 * index : 2 * index + 2, :, : att.shape[4]].copy_(att)
        return PoolSlot(index, prompt_frames, np.arange(att.shape[4]), self)

    def release(self, slot: PoolSlot) -> None:
        """Give the slot back (idempotent); its positions are unreachable until reacquired,
        which overwrites the cache and resets its order."""
        if not slot.released and slot.owner is self:
            slot.released = True
            heapq.heappush(self._free, slot.index)

    def owns(self, slot: PoolSlot | None) -> bool:
        return slot is not None and not slot.released and slot.owner is self

    def forward_chunk(self, cfm: CausalConditionalCFM, mu: torch.Tensor, mel_frames: list[int],
                      spks: torch.Tensor, cond: torch.Tensor, slots: list[PoolSlot],
                      cnn: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`CausalConditionalCFM.forward_chunk` over pooled caches, already cut (cnn: each
        stream's [steps, depth, 2, 2 hidden, 2]) -> (mel [R, 80, T], next cnn caches)."""
        inputs = self.pack(cfm, mu, mel_frames, spks, cond, slots, cnn)
        outputs = self.solver(inputs)
        self.commit(outputs.new_kv, mel_frames, slots)
        # one copy for all streams: the solver's outputs are reused by its next call
        per_stream = outputs.cnn.unflatten(2, (2, len(slots))).movedim(3, 0).clone()
        return outputs.mel, list(per_stream.unbind(0))

    def pack(self, cfm: CausalConditionalCFM, mu: torch.Tensor, mel_frames: list[int],
             spks: torch.Tensor, cond: torch.Tensor, slots: list[PoolSlot],
             cnn: list[torch.Tensor]) -> PooledSolverInputs:
        lengths = [len(slot.order) for slot in slots]
        order = np.full((len(slots), max(lengths)), self.zero_position, dtype=np.int64)
        for b, slot in enumerate(slots):
            order[b, : lengths[b]] = slot.order
        rows = [2 * slot.index for slot in slots] + [2 * slot.index + 1 for slot in slots]
        key_valid, num_new, pool_rows, orders = to_device_packed([  # one host -> device copy
            window_first_mask_host(mel_frames * 2, mu.shape[2], lengths * 2, order.shape[1]),
            np.asarray(mel_frames * 2, dtype=np.int64), np.asarray(rows, dtype=np.int64),
            np.concatenate([order, order])], mu.device)
        return PooledSolverInputs(
            noise=cfm.start_noise(lengths, mel_frames, mu.shape[2]), mu=mu, spks=spks,
            cond=cond, cnn=rows_last(torch.stack(cnn)), key_valid=key_valid, num_new=num_new,
            rows=pool_rows, order=orders,
        )

    def commit(self, new_kv: torch.Tensor, mel_frames: list[int], slots: list[PoolSlot]) -> None:
        """new_kv: [steps, depth, 2 R, H, T, 2 head_dim] -> each stream's grown and cut cache:
        its kept new frames written into free positions, its order updated."""
        parts = []  # per stream and half: (pool row, position, DiT row, window frame) columns
        for b, (slot, frames) in enumerate(zip(slots, mel_frames)):
            positions, kept = self._grow_and_cut(slot, frames)
            for half in (0, 1):  # conditional, unconditional
                parts.append(np.stack([np.full_like(kept, 2 * slot.index + half), positions,
                                       np.full_like(kept, b + half * len(slots)), kept]))
        writes = np.concatenate(parts, axis=1)
        if writes.shape[1] == 0:
            return
        # pinned and queued: a pageable copy would wait here for the whole solve to finish
        index = to_device(writes, new_kv.device)
        if self._estimator.wants_fused_kernels(new_kv):
            from backends.models.token2wav.pool_scatter_kernel import scatter_frames  # Triton
            scatter_frames(self.att, new_kv, index)
            return
        rows, positions, dit_rows, frames = index.unbind(0)
        self.att[:, :, rows, :, positions] = new_kv[:, :, dit_rows, :, frames]

    def _grow_and_cut(self, slot: PoolSlot, frames: int) -> tuple[np.ndarray, np.ndarray]:
        """Update the slot's order to cut([this window's frames | its cache]) (the rule of
        `cache_pruning.cut`) -> (positions, window frames) of the new frames kept."""
        grown = frames + len(slot.order)
        kept = np.arange(grown)
        if grown > slot.prompt_frames + self.keep:
            kept = np.concatenate([kept[: slot.prompt_frames], kept[grown - self.keep :]])
        is_new = kept < frames
        old = slot.order[kept[~is_new] - frames]
        free = np.ones(self.capacity, dtype=bool)
        free[old] = False
        positions = np.flatnonzero(free)[: int(is_new.sum())]
        order = np.empty_like(kept)
        order[is_new], order[~is_new] = positions, old
        slot.order = order
        return positions, kept[is_new]
