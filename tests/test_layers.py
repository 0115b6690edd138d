"""The import graph: floors from pyproject's import-linter contract, no private names across modules, no cycles in
the package, and no two modules anywhere in the tree (package, tests' helpers, examples, benchmarks) importing each
other."""

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


# Every importable tree of the repository, as folder -> the folder on `sys.path` its modules are named from: the
# packages from the root, tests' helpers as `support.*` (tests/ is on the path), the benchmark scripts by their own
# names (each runs with benchmarks/ on the path, as `import common`).
TREES = {
    "agentic_rl": ".",
    "ascend": ".",
    "examples": ".",
    "tests/support": "tests",
    "benchmarks": "benchmarks",
}


def _tree_modules(root: Path, trees: dict[str, str]) -> dict[str, tuple[Path, str]]:
    """Module name -> (its file, the tree it belongs to)."""
    modules: dict[str, tuple[Path, str]] = {}
    for folder, base in trees.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / base).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, folder)
    return modules


def _imported_names(name: str, path: Path) -> list[list[str]]:
    """For each name a module imports (at any depth, in functions too): the dotted names it may be, most specific
    first (`from a import b` is module `a.b` or a name in module `a`)."""
    found: list[list[str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found += [[f"{base}.{alias.name}", base] for alias in node.names]
    return found


def _import_graph(root: Path, trees: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports directly. A tree named from the root sees every such tree; a
    tree named from its own folder (scripts) is seen only by its own modules."""
    modules = _tree_modules(root, trees)
    graph: dict[str, set[str]] = {}
    for name, (path, tree) in modules.items():
        visible = {m for m, (_, t) in modules.items() if t == tree or trees[t] == "."}
        graph[name] = set()
        for candidates in _imported_names(name, path):
            for candidate in candidates:
                while candidate and candidate not in visible:
                    candidate = candidate.rpartition(".")[0]  # a name in a module, or a module not in the tree
                if candidate:
                    if candidate != name:
                        graph[name].add(candidate)
                    break
    return graph


def _mutual_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every pair of modules that import each other."""
    return sorted((a, b) for a, imported in graph.items() for b in imported if a < b and a in graph.get(b, ()))


def test_no_two_modules_of_the_tree_import_each_other():
    graph = _import_graph(ROOT, TREES)
    # the graph reaches every tree: packages, tests' helpers, examples and the benchmark scripts
    assert "agentic_rl.chat.renderer" in graph["agentic_rl.chat"]
    assert "agentic_rl.errors" in graph["support.engines"] and "agentic_rl.parser" in graph["examples.guess_game"]
    assert "common" in graph["peer_verifiers"] and "peer_client" in graph["peer_sim"]
    assert _mutual_imports(graph) == []


def test_the_mutual_import_check_finds_a_planted_pair(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from . import b\nA = 1\n",
        "pkg/b.py": "def f():\n    from pkg.a import A\n    return A\n",
        "pkg/c.py": "import pkg.b\nfrom pkg import a\n",
        "scripts/one.py": "import json\nimport two\n",
        "scripts/two.py": "def main():\n    import one\n",
        "scripts/three.py": "from one import something\nimport pkg.c\n",
    }
    for relative, source in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)
    graph = _import_graph(tmp_path, {"pkg": ".", "scripts": "scripts"})
    assert graph["pkg.c"] == {"pkg.a", "pkg.b"} and graph["three"] == {"one", "pkg.c"}
    assert _mutual_imports(graph) == [("one", "two"), ("pkg.a", "pkg.b")]
