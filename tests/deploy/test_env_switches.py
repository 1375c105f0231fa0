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


# An on/off switch compared with "0" or "1" by hand: a typo ("off", "false") would then serve one
# arm silently. The switches go through backends/switches.py's on_off, which refuses it.
LOOSE_READ = re.compile(r'environ\.get\(\s*(?:[A-Z0-9_]+_ENV|"MINICPMO_[A-Z0-9_]+")[^)]*\)\s*[!=]=\s*"[01]"')


def test_on_off_switches_are_read_through_the_validating_reader() -> None:
    loose = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in sorted((ROOT / "backends").rglob("*.py"))
             for m in LOOSE_READ.finditer(path.read_text())]
    assert loose == []


ON_OFF_CALL = re.compile(r"\bon_off\(\s*([A-Z0-9_]+)\b")


def test_every_on_off_switch_is_registered_with_its_default() -> None:
    """The launcher checks the registered switches before it starts anything: a switch read
    through on_off but missing from ON_OFF_DEFAULTS would escape that check (and fail its
    reader with a KeyError); a registered one no module reads is stale."""
    from backends.switches import ON_OFF_DEFAULTS

    read = set()
    for path in (ROOT / "backends").rglob("*.py"):
        text = path.read_text()
        for constant in ON_OFF_CALL.findall(text):
            value = re.search(rf'^{constant} = "(MINICPMO_[A-Z0-9_]+)"', text, re.MULTILINE)
            assert value, f"{path.relative_to(ROOT)}: on_off({constant}) is not a module constant"
            read.add(value.group(1))
    assert read, "no on_off call found: the pattern or the layout changed"
    assert read == set(ON_OFF_DEFAULTS)
