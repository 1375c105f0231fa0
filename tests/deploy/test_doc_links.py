"""The guides stay in step with the repository: every relative link of README.md, docs/*.md,
deploy/README.md and perf/README.md reaches a file (and, with `#anchor`, one of its headings),
every repository path they name exists, and every `python -m` module they run is there.

A page that names a module after a move, or links a heading after a rename, fails here instead
of sending a reader nowhere."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "deploy" / "README.md", ROOT / "perf" / "README.md",
                *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
TOP_FOLDERS = ("backends", "client", "deploy", "docs", "model_repository", "perf", "scripts", "tests")
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_FOLDERS)})/[\w./*<>-]*[\w/*>])")
MODULE = re.compile(r"python3? -m ((?:backends|client|perf)(?:\.\w+)+)")
# Paths a page names that a checkout does not hold until something writes them.
GENERATED = ("perf/out",)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation gone, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
            broken.append(f"{target}: no heading #{anchor}")
    return broken


def _exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def _missing_paths(page: Path) -> list[str]:
    text = page.read_text()
    named = {path.rstrip("./") for path in REPO_PATH.findall(text) if "<" not in path}  # <placeholder>
    missing = [p for p in sorted(named) if not p.startswith(GENERATED) and not _exists(p)]
    for module in sorted(set(MODULE.findall(text))):
        base = ROOT / module.replace(".", "/")
        if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
            missing.append(f"python -m {module}")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert _broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_and_module_exists(page: Path) -> None:
    assert _missing_paths(page) == []


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A `code` heading, twice\n# A `code` heading, twice\n"
                    "[ok](#a-code-heading-twice-1) [gone](#nowhere) [file](missing.md)\n"
                    "`backends/no_such_module.py`, `tests/no_such_*.py`, `tests/<any>.py`, `perf/out/x`\n"
                    "`python -m backends.no_such_module`, `python -m backends.serving.health`\n")
    assert _broken_links(page) == ["#nowhere: no heading #nowhere", "missing.md: no such file"]
    assert _missing_paths(page) == ["backends/no_such_module.py", "tests/no_such_*.py",
                                    "python -m backends.no_such_module"]
