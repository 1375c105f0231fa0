"""On/off switches read from the environment at load (the A/B switches of deploy/README.md):
"1" or "0", unset means the default; any other value is refused, so a typo never silently
serves the other arm."""
from __future__ import annotations

import os
from collections.abc import Mapping


def on_off(name: str, default: bool = True, environ: Mapping[str, str] = os.environ) -> bool:
    value = environ.get(name, "1" if default else "0")
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"
