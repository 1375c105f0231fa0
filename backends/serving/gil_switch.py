"""The interpreter's GIL switch interval in the model processes (an A/B switch for now).

Each stage process runs its engine thread beside a metrics thread and a response thread. Two
things make the engine thread wait for the GIL: 2.51's custom-metric binding keeps the GIL
through its IPC round trip to the server, and a thread that asks for the GIL back (after a CUDA
wait, say) while another thread runs Python bytecode waits up to the switch interval (5 ms by
default) for it to yield. `MINICPMO_GIL_SWITCH_S` sets the interval for A/B runs on a GPU
(scripts/gpu_duplex_bench.sh passes the environment through); unset, Python's default stays:
0.5 ms measured no better on the H200 (perf/results/duplex_h200.md, run 11: TTFP at 16
sessions 165 ms against 142 with the default, the same at 1 and 4).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

SWITCH_ENV = "MINICPMO_GIL_SWITCH_S"


def configure_switch_interval(environ: Mapping[str, str] = os.environ) -> float:
    """Apply `MINICPMO_GIL_SWITCH_S` if set; returns the interval now in force (seconds)."""
    value = environ.get(SWITCH_ENV, "").strip()
    if value:
        seconds = float(value)
        if not 0.0 < seconds <= 1.0:
            raise ValueError(f"{SWITCH_ENV} must be in (0, 1] seconds, got {value!r}")
        sys.setswitchinterval(seconds)
    return sys.getswitchinterval()
