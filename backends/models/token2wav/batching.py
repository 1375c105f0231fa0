"""Packing per-stream tensors of different lengths into one batch, and the key masks for it.

Caches are padded along their time axis (left for the Conformer, whose relative positions
need the windows aligned at the end; right for the DiT, which has no positions), and a key
mask marks the real frames so padding never takes part in attention. Masks are built on the
host and queued to the device pinned (a pageable copy would wait for the work in flight).
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.host_staging import to_device


def left_pad(rows: list[torch.Tensor], dim: int, length: int | None = None) -> torch.Tensor:
    """rows: same shape except along `dim` -> [len(rows), ...] with zeros before each row's
    frames, so every row ends at the last index of `dim` (of size `length`, default the
    longest row). Rows that need no padding are stacked (a single one: a view of it)."""
    length = max(row.shape[dim] for row in rows) if length is None else length
    if all(row.shape[dim] == length for row in rows):
        return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)
    shape = list(rows[0].shape)
    shape[dim] = length
    out = rows[0].new_zeros(len(rows), *shape)
    for index, row in enumerate(rows):
        out[index].narrow(dim, length - row.shape[dim], row.shape[dim]).copy_(row)
    return out


def right_pad(rows: list[torch.Tensor], dim: int, length: int | None = None) -> torch.Tensor:
    """rows: same shape except along `dim` -> [len(rows), ...] with zeros after each row's
    frames (padded to `length`, default the longest row). Rows that need no padding are
    stacked."""
    length = max(row.shape[dim] for row in rows) if length is None else length
    if all(row.shape[dim] == length for row in rows):
        return torch.stack(rows)
    shape = list(rows[0].shape)
    shape[dim] = length
    out = rows[0].new_zeros(len(rows), *shape)
    for index, row in enumerate(rows):
        out[index].narrow(dim, 0, row.shape[dim]).copy_(row)
    return out


def key_masks(parts: list[tuple[list[int], int, list[int], int]]) -> list[np.ndarray]:
    """Key masks of one batch, each for keys laid out as [left-padded cache | right-padded
    window] (a part: cache_lens, num_cache, new_lens, num_new) -> [B, num_cache + num_new]
    bool host arrays, True where a key is real (the caller queues them with its other arrays
    in one copy: `host_staging.to_device_packed`)."""
    return [np.concatenate([np.arange(num_cache) >= num_cache - np.asarray(cache_lens)[:, None],
                            np.arange(num_new) < np.asarray(new_lens)[:, None]], axis=1)
            for cache_lens, num_cache, new_lens, num_new in parts]


def window_first_mask(new_lens: list[int], num_new: int, cache_lens: list[int], num_cache: int,
                      device: torch.device | str) -> torch.Tensor:
    """Keys laid out as [right-padded window | right-padded cache] ->
    [B, num_new + num_cache] bool, True where a key is real."""
    return to_device(window_first_mask_host(new_lens, num_new, cache_lens, num_cache), device)


def window_first_mask_host(new_lens: list[int], num_new: int, cache_lens: list[int],
                           num_cache: int) -> np.ndarray:
    """`window_first_mask` as a host array (for a caller that copies several at once)."""
    new = np.arange(num_new) < np.asarray(new_lens)[:, None]
    cache = np.arange(num_cache) < np.asarray(cache_lens)[:, None]
    return np.concatenate([new, cache], axis=1)


def take_frames(sequence: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """sequence: [channels, L] -> its frames start .. start + count - 1, as a new tensor."""
    return sequence[:, start : start + count].clone()
