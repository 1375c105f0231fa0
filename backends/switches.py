"""On/off switches read from the environment at load (the A/B switches of deploy/README.md):
"1" or "0", unset means the default; any other value is refused, so a typo never silently
serves the other arm. Every switch is registered here with its default: the launcher checks
them all before it starts anything, and a reader of an unregistered name fails at once."""
from __future__ import annotations

import os
from collections.abc import Mapping

ON_OFF_DEFAULTS: dict[str, bool] = {
    "MINICPMO_STAGE_CALL_METRICS": False,  # backends/serving/metrics_stage_calls.py
}


def on_off(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    value = environ.get(name, "1" if ON_OFF_DEFAULTS[name] else "0")
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def check_switches(environ: Mapping[str, str] = os.environ) -> None:
    """ValueError naming the first switch set to neither 0 nor 1."""
    for name in ON_OFF_DEFAULTS:
        on_off(name, environ)
