"""Where the official MiniCPM-o 4.5 code and its build live, and how a build is made.

The official code lives outside the repository, at `<repository>/../shared/reference/
minicpmo45-official`. `scripts/setup.sh` builds `.venv-official` (its transformers 4.51 stack)
where that code exists; `ensure_built` runs `build_official.py` there once: tiny checkpoints
written by the official classes and the official outputs for fixed inputs. The result is
cached under `.cache/official/<key>/`, the key a hash of everything that decides it (the
builder, the official files, the environment's requirements, the seed), so later runs reuse
it and any change rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = REPO.parent / "shared" / "reference" / "minicpmo45-official"
VENV_PYTHON = REPO / ".venv-official" / "bin" / "python"
BUILDER = Path(__file__).with_name("build_official.py")
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
CACHE = REPO / ".cache" / "official"
SEED = 0
BUILD_TIMEOUT_S = 600
_COMPLETE = "complete"


@dataclass(frozen=True, slots=True)
class OfficialOutputs:
    """One build: checkpoints by stored dtype, reference outputs by name and variant."""

    root: Path

    def checkpoint(self, stored: str = "float32") -> Path:
        """`float32` or `bfloat16`: the directory the official `save_pretrained` wrote."""
        return self.root / f"ckpt-{stored}"

    def arrays(self, name: str, variant: str = "float32") -> dict[str, np.ndarray]:
        with np.load(self.root / f"{name}-{variant}.npz") as data:
            return {key: data[key] for key in data.files}

    def values(self, name: str, variant: str = "float32") -> dict[str, Any]:
        return json.loads((self.root / f"{name}-{variant}.json").read_text(encoding="utf-8"))


def build_key() -> str:
    digest = hashlib.sha256()
    digest.update(f"seed={SEED}".encode())
    for file in [BUILDER, REQUIREMENTS, *sorted(p for p in OFFICIAL.iterdir() if p.is_file())]:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _build(root: Path) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build.", dir=CACHE))
    try:
        done = subprocess.run(
            [str(VENV_PYTHON), str(BUILDER), "--official", str(OFFICIAL), "--out", str(staging),
             "--seed", str(SEED)],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"build_official.py failed ({done.returncode}):\n{done.stderr[-4000:]}")
        (staging / _COMPLETE).touch()
        for stale in CACHE.iterdir():  # one build is kept: older keys are dead weight
            if stale.name != root.name and not stale.name.startswith("."):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / _COMPLETE).is_file():  # not another process's finished build
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_built() -> OfficialOutputs:
    """The current build (made now if missing); skips without the official code."""
    if not (OFFICIAL / "modeling_minicpmo.py").is_file():
        pytest.skip(f"the official MiniCPM-o 4.5 code is not at {OFFICIAL}")
    if not VENV_PYTHON.is_file():
        pytest.fail(f"{VENV_PYTHON} is missing: run scripts/setup.sh (it builds the official "
                    f"environment whenever the official code is present)")
    root = CACHE / build_key()
    if not (root / _COMPLETE).is_file():
        _build(root)
    return OfficialOutputs(root)
