"""Shared fixtures: one tiny checkpoint per test session, and throw-away copies to break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backends.checkpoint.tiny import ensure_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed-0 tiny checkpoint; tests must not modify it (use `tiny_copy`)."""
    return ensure_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny", seed=0)


@pytest.fixture
def tiny_copy(tiny_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_dir, tmp_path / "copy"))
