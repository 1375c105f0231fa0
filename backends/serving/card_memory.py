"""Whether the GPU a planned profile starts on has the memory its plan was made for.

A profile with `gpu_memory_gib` sizes every stage's allocator share from that number
(memory_plan.py); started on a smaller card, the stages fail one by one during load, a minute
later and with out-of-memory tracebacks. This check reads the card first (`nvidia-smi`, no CUDA
context) and refuses at once, naming what would fit.
"""
from __future__ import annotations

import os
import shutil
import subprocess

GIB_MIB = 1024
TOLERANCE_GIB = 1.0  # cards of one model differ by a few hundred MiB; torch sees a little less


def card_memory_gib(gpu: int, query: str | None = None) -> float | None:
    """Total memory of visible GPU `gpu` (GiB), or None where no NVIDIA tool answers."""
    if query is None:
        if shutil.which("nvidia-smi") is None:
            return None
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    totals = {int(index): float(mib) / GIB_MIB for index, mib in
              (line.split(",") for line in query.strip().splitlines() if line.count(",") == 1)}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    order = [int(v) for v in visible.split(",")] if visible and all(v.strip().isdigit() for v in visible.split(",")) \
        else sorted(totals)
    return totals.get(order[gpu]) if gpu < len(order) else None


def check_card(profile_name: str, planned_gib: float, card_gib: float | None) -> None:
    """ValueError when the card is smaller than the plan's; nothing when it is not, or is unknown."""
    if card_gib is None or planned_gib <= 0 or card_gib + TOLERANCE_GIB >= planned_gib:
        return
    raise ValueError(f"profile {profile_name} is planned for a GPU of {planned_gib:.1f} GiB and this one has "
                     f"{card_gib:.1f} GiB: add `--set gpu_memory_gib={card_gib:.1f}` (the plan then says how many "
                     f"sessions fit, `--set max_sessions=N`), or choose a profile made for this card")
