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


def to_device_packed(arrays: list[np.ndarray], device: torch.device | str) -> list[torch.Tensor]:
    """`to_device` of each array (same shapes and dtypes) through one pinned block and one
    queued copy: on CUDA every copy costs the host a pinned allocation and a launch, and a
    batch's small index and mask arrays are several. Parts start at 8-byte offsets, so each
    device tensor is a view of the copy."""
    if torch.device(device).type != "cuda":
        return [to_device(array, device) for array in arrays]
    parts = [np.ascontiguousarray(array) for array in arrays]
    offsets, total = [], 0
    for part in parts:
        offsets.append(total)
        total += -(-part.nbytes // 8) * 8
    block = torch.empty(max(total, 8), dtype=torch.uint8, pin_memory=True)
    host = block.numpy()
    for part, start in zip(parts, offsets):
        host[start : start + part.nbytes] = part.reshape(-1).view(np.uint8)
    joined = block.to(device, non_blocking=True)
    return [joined[start : start + part.nbytes].view(_torch_dtype(part.dtype)).view(part.shape)
            for part, start in zip(parts, offsets)]


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def copy_to_device(dst: torch.Tensor, array: np.ndarray) -> None:
    """Queue `dst.copy_(array)` (same number of elements); `dst` keeps its address, as a
    buffer read by a captured graph must."""
    host = torch.from_numpy(np.ascontiguousarray(array)).view(dst.shape)
    if dst.device.type == "cuda":
        host = host.pin_memory()
    dst.copy_(host, non_blocking=True)


class PinnedStaging:
    """Persistent pinned host twins of one device buffer that is restaged every step (a graph's
    input buffer): `host()` hands a twin's numpy view to fill in place, `publish()` queues its
    copy into the buffer. `copy_to_device` allocates a pinned block, copies the array into it
    and, for these buffers, the caller first built the array (a fill and a concatenation of a
    capacity-sized block table): ~5% of a Thinker step at 16 sessions on the H200 host.

    Two twins alternate, each with the event of its last copy: the host never writes a twin
    the device may still be reading, and with one step in flight it never waits for it."""

    def __init__(self, buffer: torch.Tensor, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.buffer = buffer
        on_cuda = buffer.device.type == "cuda"
        self._twins = [torch.zeros(buffer.shape, dtype=buffer.dtype, pin_memory=on_cuda)
                       for _ in range(depth)]
        self._events = [torch.cuda.Event() if on_cuda else None for _ in range(depth)]
        self._next = 0

    def host(self) -> np.ndarray:
        """The next twin (the buffer's shape, numpy), once the device has read its last copy.
        It holds what was staged two publishes ago: the caller writes every element."""
        event = self._events[self._next]
        if event is not None:
            event.synchronize()  # returns at once for an event never recorded
        return self._twins[self._next].numpy()

    def publish(self) -> None:
        """Queue the twin `host()` handed out into the buffer; the next `host()` is the other."""
        self.buffer.copy_(self._twins[self._next], non_blocking=True)
        event = self._events[self._next]
        if event is not None:
            event.record()
        self._next = (self._next + 1) % len(self._twins)
