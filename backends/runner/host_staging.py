"""Host -> device copies that never block the host: numpy through pinned memory.

A copy from pageable memory makes the host wait for the device; from pinned memory it is only
queued. Pinned blocks come from torch's caching host allocator, which records an event on each
block used by a copy and reuses the block only after that event: the pinned-buffer ring of the
design, with the reuse race handled by the allocator.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A new device tensor with `array`'s contents, queued without a host wait on CUDA."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_to_device(dst: torch.Tensor, array: np.ndarray) -> None:
    """Queue `dst.copy_(array)` (same number of elements); `dst` keeps its address, as a
    buffer read by a captured graph must."""
    host = torch.from_numpy(np.ascontiguousarray(array)).view(dst.shape)
    if dst.device.type == "cuda":
        host = host.pin_memory()
    dst.copy_(host, non_blocking=True)
