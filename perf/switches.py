"""The project's environment variables a benchmark ran under, for its result file.

A run with the stage-call diagnostics on (`MINICPMO_STAGE_CALL_METRICS=1`, deploy/README.md
lists the variables) pays for their metric updates, so a result file that does not name its
settings cannot be compared with another. The benchmarks print the `MINICPMO_*` variables set
in their own environment; the duplex benchmark's server inherits the same environment when
`scripts/gpu_duplex_bench.sh` starts both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PREFIX = "MINICPMO_"


def active_switches(environ: Mapping[str, str] = os.environ) -> str:
    """'NAME=value, ...' of the set MINICPMO_* variables, sorted; 'none (defaults)' without."""
    found = sorted(f"{name}={value}" for name, value in environ.items() if name.startswith(PREFIX))
    return ", ".join(found) if found else "none (defaults)"
