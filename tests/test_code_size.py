"""Small pieces: no function over 80 lines and no module over 600 lines in the package (docstrings included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_rl", "ascend")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _functions(path: Path) -> list[tuple[str, int]]:
    """`(qualified name, lines)` of every function and method of a module, nested ones too."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_check_sees_every_module_and_counts_whole_definitions(tmp_path):
    assert len(_modules()) > 50
    sample = tmp_path / "m.py"
    sample.write_text('def f():\n    """Doc."""\n\n    def g():\n        return 1\n\n    return g\n')
    assert _functions(sample) == [("f", 7), ("f.g", 2)]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path: Path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_MODULE_LINES})"
    long = [(name, n) for name, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
