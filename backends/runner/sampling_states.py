"""Per-slot sampling parameters on the device, and the batched draw that reads them by slot.

As vLLM MRv2's `sample/states.py`: a request's temperature, top-k, top-p and seed are written
into its slot's row once, when it is admitted (on the host; the next forward publishes every
admission since the last in one copy per table); a step hands over only its rows' slots and
positions, and `sample` gathers the rest on the device (step seeds included), with the
runner's `DeviceLogitsProcessor` around the draw. So the same code runs eagerly or inside a
CUDA graph, and draws exactly what the host sampler would (same counter noise, same order).

Row `scratch_slot` (= max_num_reqs) never belongs to a request: graph padding rows and rows
sampled on the host point at it, and it holds greedy defaults.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.device_sampler import as_int64, sample_on_device, step_seeds
from backends.runner.host_staging import copy_to_device
from backends.runner.types import DeviceLogitsProcessor, SamplingParams


class SamplingStates:
    def __init__(
        self,
        max_num_reqs: int,
        device: torch.device | str,
        processor: DeviceLogitsProcessor | None = None,
    ) -> None:
        self.scratch_slot = max_num_reqs
        self.processor = processor
        rows = max_num_reqs + 1
        # [rows, 2] float32: temperature, top_p; [rows, 2] int64: top_k, seed (as_int64).
        # `set` writes the host mirrors; `flush` publishes them whole (a few hundred bytes) in
        # one queued copy per table, so a burst of admissions costs two copies, not two each.
        self._floats_host = np.array([[0.0, 1.0]] * rows, dtype=np.float32)
        self._ints_host = np.array([[-1, 0]] * rows, dtype=np.int64)
        self._floats = torch.from_numpy(self._floats_host.copy()).to(device)
        self._ints = torch.from_numpy(self._ints_host.copy()).to(device)
        self._dirty = False

    def set(self, slot: int, params: SamplingParams) -> None:
        """Write a newly admitted request's params; on the device from the next `flush`."""
        self._floats_host[slot] = (params.temperature, params.top_p)
        self._ints_host[slot] = (params.top_k, as_int64(params.seed))
        self._dirty = True

    def flush(self) -> None:
        """Publish the rows `set` wrote since the last flush (queued in stream order, no host
        wait). The runner calls it before every forward, as a graph replay reads the tables
        without running `sample`; an eager `sample` flushes too."""
        if self._dirty:
            copy_to_device(self._floats, self._floats_host)
            copy_to_device(self._ints, self._ints_host)
            self._dirty = False

    def flush_unless_capturing(self) -> None:
        """`flush` on an eager call; never inside a graph capture (a captured copy would
        replay the staged bytes of that moment)."""
        if not (self._floats.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.flush()

    def sample(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        use_filters: bool = True,
    ) -> torch.Tensor:
        """logits: [rows, vocab] float32 (the processor edits it in place); slots: [rows]
        int64; positions: [rows] int64 where each sampled token will sit -> [rows] int64.

        `use_filters` False skips the top-k/top-p sort; only pass it when no row sets them
        (graphs always filter: filters never change an unfiltered or greedy row's token)."""
        self.flush_unless_capturing()
        if self.processor is not None:
            self.processor.apply(logits, slots)
        floats = self._floats.index_select(0, slots)
        ints = self._ints.index_select(0, slots)
        seeds = step_seeds(ints[:, 1], positions)
        tokens = sample_on_device(
            logits, floats[:, 0], ints[:, 0], floats[:, 1], seeds, use_filters
        )
        if self.processor is not None:
            tokens = self.processor.update(tokens, slots)
        return tokens
