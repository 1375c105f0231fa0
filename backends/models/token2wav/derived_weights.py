"""Tensors computed from a module's parameters (packed or pre-scaled weights), kept until one
of those parameters changes.

A forward that would concatenate or scale weights every call (a few kernels each time, inside
every CUDA graph) reads them from here instead. The key is every parameter's storage, dtype,
device and version counter, so replacing, casting or loading into a weight rebuilds them; a
rebuild of the same shapes writes into the kept tensors, which captured graphs go on reading
(a graph replays no Python, so it sees new weights only through the same addresses). Nothing
is kept from inside a graph capture: tensors made there belong to the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


def derived(owner: nn.Module, name: str, params: Sequence[torch.Tensor],
            build: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """`build()` (no autograd) for `params`' current values, kept on `owner` under `name`."""
    key = tuple((p.data_ptr(), p.dtype, p.device, _version(p)) for p in params)
    kept = owner.__dict__.get(name)
    if kept is not None and kept[0] == key:
        return kept[1]
    with torch.no_grad():
        tensors = build()
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        return tensors
    if kept is not None and _refreshable(kept[1], tensors):
        tensors = tuple(old.copy_(new) for old, new in zip(kept[1], tensors))
    owner.__dict__[name] = (key, tensors)
    return tensors


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return -1


def _refreshable(old: tuple[torch.Tensor, ...], new: tuple[torch.Tensor, ...]) -> bool:
    """`old` can take `new`'s values in place: same layouts, and writable here."""
    same = all((a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device) for a, b in zip(old, new))
    return same and (torch.is_inference_mode_enabled() or not any(a.is_inference() for a in old))
