"""The fast path's sampling step through its processor's fused draw, where it offers one.

`SamplingStates.sample` runs the processor's `apply`, the torch device sampler and `update`:
tens of small kernels per step. A processor with a `FusedDraw` (the Talker's policy table)
does the same as one kernel; `FusedSamplingStates` hands it the step's rows and the per-slot
sampling tables. The same callable serves eager steps, decode graphs and decode chains, so a
graph captures whichever path the runner was built with.

`sampling_states_for` picks it on CUDA only: the torch path stays the reference and the CPU
path (the interpreter would run the kernel, slowly).
"""

from __future__ import annotations

import torch

from backends.runner.sampling_states import SamplingStates
from backends.runner.types import DeviceLogitsProcessor, FusedDraw


class FusedSamplingStates(SamplingStates):
    """`SamplingStates` whose `sample` is the processor's fused draw."""

    def __init__(
        self,
        max_num_reqs: int,
        device: torch.device | str,
        processor: DeviceLogitsProcessor,
        draw: FusedDraw,
    ) -> None:
        super().__init__(max_num_reqs, device, processor)
        self.draw = draw

    def sample(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        use_filters: bool = True,
    ) -> torch.Tensor:
        """As `SamplingStates.sample`; the kernel filters every row exactly, so skipping the
        filters (`use_filters` False: no row sets them) would change nothing."""
        self.flush_unless_capturing()
        return self.draw(logits, slots, positions, self._floats, self._ints)


def sampling_states_for(
    max_num_reqs: int, device: torch.device | str, processor: DeviceLogitsProcessor | None
) -> SamplingStates:
    """The fused states where the processor has a fused draw, on CUDA."""
    draw: FusedDraw | None = getattr(processor, "fused_draw", None)
    if processor is None or draw is None or torch.device(device).type != "cuda":
        return SamplingStates(max_num_reqs, device, processor)
    return FusedSamplingStates(max_num_reqs, device, processor, draw)
