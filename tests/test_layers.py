"""The package's import graph: floors from pyproject's import-linter contract, and no private names across modules."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_layers_contract_is_kept():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint_imports, "import-linter is a test dependency: install the project's [test] extra"
    result = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def _private_imports(source: str, label: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("agentic_rl", "ascend"):
            found += [f"{label}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_a_private_name_of_another():
    paths = sorted([*(ROOT / "agentic_rl").rglob("*.py"), *(ROOT / "ascend").rglob("*.py")])
    found = [hit for p in paths for hit in _private_imports(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert found == []


def test_the_private_import_check_finds_one():
    source = "def f():\n    from agentic_rl.tools.calculator import CalculatorTool, _private\n"
    assert _private_imports(source, "probe.py") == ["probe.py: agentic_rl.tools.calculator._private"]


def _cycles(graph) -> list[tuple[str, str]]:
    """Every direct import `a -> b` for which `b` also reaches `a`."""
    return [
        (module, imported)
        for module in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(importer=imported, imported=module)
    ]


def test_the_import_graph_has_no_cycles():
    import grimp

    assert _cycles(grimp.build_graph("agentic_rl", "ascend")) == []


def test_the_cycle_check_finds_one():
    import grimp

    graph = grimp.ImportGraph()
    for name in ("pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    assert _cycles(graph) == []
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(graph) == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a")]
