"""Resolve the `checkpoint` variable of a profile to what the stage models load."""
from __future__ import annotations

from pathlib import Path

TINY = "tiny"
FULL_RANDOM = "full-random"
TINY_SEED = 0


def prepare_checkpoint(spec: str, cache_dir: Path) -> Path | None:
    """Return the directory to load, generating the tiny one on first use.

    `full-random` has no files (the stages build the real dimensions with random weights on
    the device), so it returns None and the spec is passed through unchanged.
    """
    if spec == FULL_RANDOM:
        return None
    if spec == TINY:
        from backends.checkpoint.tiny import ensure_tiny_checkpoint

        return ensure_tiny_checkpoint(cache_dir / f"tiny-seed{TINY_SEED}", seed=TINY_SEED)
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(f"checkpoint {spec!r} is neither 'tiny', 'full-random' nor an existing directory")
    return path.resolve()
