"""The packages of backends/ import one way: each only from the layers below it, in the order
that backends/__init__.py states; client/ imports nothing from backends.

Strategy: every module is parsed, never imported, so an import inside a function or under
TYPE_CHECKING counts as much as one at the top, and relative imports are resolved against the
module's package. The scanner is first run on a small synthetic tree holding each import form
and each kind of violation, so a scanner that missed a form fails here instead of passing.
"""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "backends"
# Bottom to top; packages of one layer may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("contracts",), ("runner",), ("models",), ("audio",), ("checkpoint",), ("thinker", "talker"),
    ("stages",), ("duplex",), ("serving",), ("gateway",),
)
# Top-level modules that import nothing from backends (every layer may use them); none today.
LEAVES: tuple[str, ...] = ()
ROOT_MODULE = "__init__"  # backends/__init__.py: a docstring, imports nothing either


@dataclass(frozen=True, slots=True)
class Import:
    source: Path  # the importing file, relative to the scanned root
    line: int
    target: str  # dotted name, e.g. "backends.models.qwen3.Qwen3Config"

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def imports_of(path: Path, root: Path) -> Iterator[Import]:
    """Every import statement of the file, anywhere in it, with relative ones made absolute."""
    relative = path.relative_to(root)
    package = list(relative.with_suffix("").parts[:-1])  # level 1 of a relative import
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(relative, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute_module(node, package, relative)
            # `from backends import util` names a module: keep each imported name.
            for alias in node.names:
                yield Import(relative, node.lineno, base if alias.name == "*" else f"{base}.{alias.name}")


def _absolute_module(node: ast.ImportFrom, package: list[str], relative: Path) -> str:
    if node.level == 0:
        return node.module or ""
    if node.level - 1 > len(package):
        raise ValueError(f"{relative}:{node.lineno}: relative import climbs above the root")
    parts = package[: len(package) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def scan(root: Path, folder: str) -> list[Import]:
    """The imports of every module under root/folder, by file and line."""
    found = [imp for path in (root / folder).rglob("*.py") for imp in imports_of(path, root)]
    return sorted(found, key=lambda imp: (imp.source.parts, imp.line))


def unit_of_file(relative: Path) -> str:
    """The package (or top-level module) of backends/ that a file belongs to."""
    parts = relative.with_suffix("").parts
    return parts[1]  # backends/<package>/... or backends/<module>.py


def unit_of_target(target: str) -> str | None:
    """The package (or top-level module) of backends/ an import names; None outside it."""
    parts = target.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else ROOT_MODULE


def rank_of() -> dict[str, int]:
    return {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


def edges(imports: list[Import]) -> Iterator[tuple[str, str, Import]]:
    """(importing unit, imported unit, import) for every import between two units of backends."""
    for imp in imports:
        source, target = unit_of_file(imp.source), unit_of_target(imp.target)
        if target is not None and target != source:
            yield source, target, imp


def layer_violations(imports: list[Import], leaves: tuple[str, ...] = LEAVES) -> list[str]:
    """Imports of a unit not below the importer, and any import of backends by a leaf."""
    rank, found = rank_of(), []
    for source, target, imp in edges(imports):
        if source in leaves or source == ROOT_MODULE:
            found.append(f"{imp.where} imports {imp.target}: top-level modules import nothing from {PACKAGE}")
        elif source in rank and target in rank and rank[target] >= rank[source]:
            found.append(f"{imp.where} imports {imp.target}: {target} is not in a layer below {source}")
    return found


def mutual_pairs(imports: list[Import]) -> list[str]:
    """Pairs of units that import each other, with one import each way."""
    first: dict[tuple[str, str], Import] = {}
    for source, target, imp in edges(imports):
        first.setdefault((source, target), imp)
    return [f"{a} <-> {b}: {first[a, b].where} imports {first[a, b].target}, "
            f"{first[b, a].where} imports {first[b, a].target}"
            for a, b in sorted(first) if a < b and (b, a) in first]


def unknown_units(root: Path, leaves: tuple[str, ...] = LEAVES) -> list[str]:
    """Packages and top-level modules of backends/ that no layer and no leaf names."""
    known = set(rank_of()) | set(leaves) | {ROOT_MODULE}
    units = {p.name if p.is_dir() else p.stem for p in (root / PACKAGE).iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    return sorted(units - known)


def client_violations(imports: list[Import]) -> list[str]:
    return [f"{imp.where} imports {imp.target}: client/ imports nothing from {PACKAGE}"
            for imp in imports if unit_of_target(imp.target) is not None]


def _fail_with(problems: list[str], what: str) -> None:
    assert not problems, f"{what}:\n  " + "\n  ".join(problems)


# The repository.

def test_backends_imports_only_from_lower_layers() -> None:
    _fail_with(layer_violations(scan(ROOT, PACKAGE)), "imports against the layer order of backends/__init__.py")


def test_no_two_packages_import_each_other() -> None:
    _fail_with(mutual_pairs(scan(ROOT, PACKAGE)), "packages of backends/ that import each other")


def test_every_package_has_a_layer() -> None:
    _fail_with(unknown_units(ROOT), "packages of backends/ missing from LAYERS or LEAVES in tests/test_layers.py")


def test_client_imports_nothing_from_backends() -> None:
    _fail_with(client_violations(scan(ROOT, "client")), "client/ imports of backends")


def test_layer_order_matches_the_package_docstring() -> None:
    doc = ast.get_docstring(ast.parse((ROOT / PACKAGE / "__init__.py").read_text())) or ""
    stated = [line.strip() for line in doc.splitlines() if " < " in line]
    assert len(stated) == 1, "backends/__init__.py must state the layer order on one line"
    layers = tuple(tuple(name.strip() for name in layer.split(",")) for layer in stated[0].split(" < "))
    assert layers == LAYERS


# The scanner, on a synthetic tree.

def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


SYNTHETIC = {
    "backends/__init__.py": '"""root"""\n',
    "backends/util.py": "import os\n",
    "backends/contracts/__init__.py": "",
    "backends/contracts/messages.py": "from backends import util\n",
    "backends/runner/__init__.py": "",
    "backends/runner/engine.py": """\
        from typing import TYPE_CHECKING

        from backends.contracts.messages import Request
        from . import helpers

        if TYPE_CHECKING:
            from backends.stages.engine import Engine

        def build():
            from ..models import qwen3
        """,
    "backends/runner/helpers.py": "",
    "backends/models/__init__.py": "",
    "backends/models/token2wav/__init__.py": "",
    "backends/models/token2wav/vocoder.py": "from ...runner.helpers import pad\nimport backends.serving.launcher\n",
    "backends/thinker/__init__.py": "",
    "backends/thinker/model.py": "from backends.talker.state import State\n",
    "backends/talker/__init__.py": "",
    "backends/talker/state.py": "",
    "backends/stages/__init__.py": "",
    "backends/stages/engine.py": "from backends.runner.engine import build\n",
    "backends/serving/__init__.py": "",
    "backends/serving/launcher.py": "from backends.stages.engine import Engine\n",
    "backends/extras/__init__.py": "",
    "client/cli.py": "import json\n\ndef main():\n    import backends.contracts.messages\n",
}


def test_scanner_resolves_every_import_form(tmp_path: Path) -> None:
    _tree(tmp_path, SYNTHETIC)
    targets = {imp.target for imp in scan(tmp_path, PACKAGE)
               if imp.source == Path("backends/runner/engine.py")}
    assert targets == {"typing.TYPE_CHECKING", "backends.contracts.messages.Request", "backends.runner.helpers",
                       "backends.stages.engine.Engine", "backends.models.qwen3"}
    vocoder = {imp.target for imp in scan(tmp_path, PACKAGE)
               if imp.source == Path("backends/models/token2wav/vocoder.py")}
    assert vocoder == {"backends.runner.helpers.pad", "backends.serving.launcher"}


def test_scanner_reports_upward_sideways_and_leaf_imports(tmp_path: Path) -> None:
    _tree(tmp_path, {**SYNTHETIC, "backends/util.py": "from backends.runner import helpers\n"})
    found = layer_violations(scan(tmp_path, PACKAGE), leaves=("util",))
    assert found == [
        "backends/models/token2wav/vocoder.py:2 imports backends.serving.launcher: "
        "serving is not in a layer below models",
        "backends/runner/engine.py:7 imports backends.stages.engine.Engine: stages is not in a layer below runner",
        "backends/runner/engine.py:10 imports backends.models.qwen3: models is not in a layer below runner",
        "backends/thinker/model.py:1 imports backends.talker.state.State: talker is not in a layer below thinker",
        "backends/util.py:1 imports backends.runner.helpers: top-level modules import nothing from backends",
    ]


def test_scanner_reports_packages_that_import_each_other(tmp_path: Path) -> None:
    _tree(tmp_path, SYNTHETIC)
    assert mutual_pairs(scan(tmp_path, PACKAGE)) == [
        "models <-> runner: backends/models/token2wav/vocoder.py:1 imports backends.runner.helpers.pad, "
        "backends/runner/engine.py:10 imports backends.models.qwen3",
        "runner <-> stages: backends/runner/engine.py:7 imports backends.stages.engine.Engine, "
        "backends/stages/engine.py:1 imports backends.runner.engine.build",
    ]


def test_scanner_reports_unknown_packages_and_client_imports(tmp_path: Path) -> None:
    _tree(tmp_path, SYNTHETIC)
    assert unknown_units(tmp_path, leaves=("util",)) == ["extras"]
    assert unknown_units(tmp_path) == ["extras", "util"]  # no leaf is declared today
    assert client_violations(scan(tmp_path, "client")) == [
        "client/cli.py:4 imports backends.contracts.messages: client/ imports nothing from backends"
    ]
