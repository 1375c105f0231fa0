"""Size budgets (docs/architecture.md#code-size-budgets), enforced so the
"thin" files stay thin: model.py <= 150 lines; backends/ files <= 300 lines
(runner/model_runner.py <= 400); functions: median <= 10 lines, p90 <= 30, none over 60."""
import ast
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE_LIMIT = 300
FILE_EXCEPTIONS = {"backends/runner/model_runner.py": 400}
MODEL_PY_LIMIT = 150


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_model_py_files_stay_thin():
    sizes = {str(p.relative_to(ROOT)): _lines(p) for p in (ROOT / "model_repository").glob("*/1/model.py")}
    assert len(sizes) >= 4 and all(n <= MODEL_PY_LIMIT for n in sizes.values()), sizes


def test_backend_files_within_budget():
    over = {}
    for path in (ROOT / "backends").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        if _lines(path) > FILE_EXCEPTIONS.get(rel, FILE_LIMIT):
            over[rel] = _lines(path)
    assert not over, f"files over budget: {over}"


def test_function_sizes():
    sizes, over = [], []
    for path in (ROOT / "backends").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                sizes.append(n)
                if n > 60:
                    over.append(f"{path.relative_to(ROOT)}:{node.name} ({n})")
    sizes.sort()
    assert not over, over
    assert statistics.median(sizes) <= 10 and sizes[int(0.9 * len(sizes))] <= 30
