"""Fixtures of the parity tests against the official MiniCPM-o 4.5 code (without that code,
every test here skips; official_outputs.py says where it is and how its outputs are built)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from backends.checkpoint.tiny import write_tiny_assets
from official_outputs import SEED, OfficialOutputs, ensure_built


@pytest.fixture(scope="session")
def official() -> OfficialOutputs:
    return ensure_built()


@pytest.fixture(scope="session")
def served(official: OfficialOutputs, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """stored dtype -> the official checkpoint as a server gets it: its files (linked) plus
    the tiny default voice and token2wav assets, which the official `save_pretrained` does
    not write and every served directory carries."""
    root = tmp_path_factory.mktemp("served")
    made: dict[str, Path] = {}

    def get(stored: str = "float32") -> Path:
        if stored not in made:
            out = root / stored
            out.mkdir()
            for file in official.checkpoint(stored).iterdir():
                (out / file.name).symlink_to(file)
            write_tiny_assets(out, SEED)
            made[stored] = out
        return made[stored]

    return get
