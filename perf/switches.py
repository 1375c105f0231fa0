"""The serving switches a benchmark ran under, for its result file.

An A/B run differs from its partner only in an environment variable (`MINICPMO_PDL=0`,
`MINICPMO_MPS_LOW_PRIORITY=code2wav`, ...: deploy/README.md lists them), so a result file that
does not name them cannot say which side it is. The benchmarks print the `MINICPMO_*` variables
set in their own environment; the duplex benchmark's server inherits the same environment when
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
