"""The `MINICPMO_*` environment variables the code reads are exactly those of deploy/README.md's
"Environment variables" table: an operator learns every one from one place, a removed one does
not linger there, and an A/B switch cannot stay behind unnoticed once its decision is made."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("backends", "perf", "scripts", "model_repository")
SKIPPED = ROOT / "perf" / "results"  # measurements of their day, naming switches since removed
NAME = re.compile(r"\bMINICPMO_[A-Z][A-Z0-9_]*")
ROW = re.compile(r"^\| `(MINICPMO_[A-Z0-9_]+)` \|", re.MULTILINE)
MAX_VARIABLES = 6  # tuning belongs in the profile (`--set`), not in the environment


def _code_files() -> list[Path]:
    files = [path for folder in SCANNED for path in (ROOT / folder).rglob("*") if path.is_file()]
    return [path for path in files if SKIPPED not in path.parents and path.suffix not in (".png", ".pyc")]


def _documented() -> list[str]:
    readme = (ROOT / "deploy" / "README.md").read_text()
    section = readme.split("## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    return ROW.findall(section)


def test_the_table_names_exactly_the_variables_the_code_reads() -> None:
    read = {name for path in _code_files() for name in NAME.findall(path.read_text(errors="replace"))}
    documented = _documented()
    assert read, "no variable found: the pattern or the layout changed"
    assert len(documented) == len(set(documented)), "a variable is listed twice"
    assert read - set(documented) == set(), "read but not in deploy/README.md's Environment variables"
    assert set(documented) - read == set(), "in deploy/README.md's Environment variables but never read"


def test_only_a_few_variables_remain() -> None:
    assert len(_documented()) <= MAX_VARIABLES
