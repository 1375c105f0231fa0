"""Every `MINICPMO_*` environment variable the package reads is in deploy/README.md's table
of environment switches, and the table names none the package no longer reads: an operator
learns every switch from one place, and a removed switch does not linger there."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r'"(MINICPMO_[A-Z0-9_]+)"')
ROW = re.compile(r"^\| `(MINICPMO_[A-Z0-9_]+)` \|", re.MULTILINE)


def test_every_switch_the_package_reads_is_documented() -> None:
    read = {m for path in (ROOT / "backends").rglob("*.py") for m in NAME.findall(path.read_text())}
    documented = set(ROW.findall((ROOT / "deploy" / "README.md").read_text()))
    assert read, "no switch found: the pattern or the layout changed"
    assert read - documented == set(), "read but not documented in deploy/README.md"
    assert documented - read == set(), "documented in deploy/README.md but never read"
