"""README's layout table lists every module of the package, one row each, and only paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_rl", "ascend")
_PATH = re.compile(r"`([^`]+)`")


def _layout_rows(readme: str) -> list[tuple[str, str]]:
    """`(path, what)` of each row of the table under `## Layout` (a row names one path, in backticks)."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[1] in ("path", "---"):
            continue
        paths = _PATH.findall(cells[1])
        assert len(paths) == 1 and f"`{paths[0]}`" == cells[1], f"a row names one path in backticks: {line}"
        rows.append((paths[0], cells[2]))
    return rows


def _modules(root: Path) -> set[str]:
    """Each module of the packages as the table names it: a file's path, or a package's folder with a `/`."""
    found = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            relative = path.relative_to(root).as_posix()
            found.add(relative.removesuffix("__init__.py") if path.name == "__init__.py" else relative)
    return found


def test_the_layout_table_lists_every_module_once_and_says_what_it_is_for():
    rows = _layout_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    listed = [path for path, _ in rows]
    assert len(listed) == len(set(listed)), sorted(p for p in listed if listed.count(p) > 1)
    assert sorted(_modules(ROOT) - set(listed)) == [], "modules missing from README's layout table"
    assert [path for path, what in rows if not what] == []


def test_every_path_of_the_layout_table_exists():
    rows = _layout_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    missing = [p for p, _ in rows if not ((ROOT / p).is_dir() if p.endswith("/") else (ROOT / p).is_file())]
    assert missing == [], "README's layout table names paths that are not in the tree"


def test_the_check_reads_a_table_and_finds_what_it_lacks(tmp_path):
    (tmp_path / "agentic_rl" / "sub").mkdir(parents=True)
    (tmp_path / "ascend").mkdir()
    for name in ("agentic_rl/__init__.py", "agentic_rl/a.py", "agentic_rl/sub/__init__.py", "ascend/__init__.py"):
        (tmp_path / name).write_text("")
    readme = (
        "# X\n\n## Layout\n\nText.\n\n| floor | path | what |\n|---|---|---|\n"
        "| 1 | `agentic_rl/` | the face |\n| 2 | `agentic_rl/a.py` | a `thing` |\n\n## Next\n\n| x | `y` | z |\n"
    )
    assert _layout_rows(readme) == [("agentic_rl/", "the face"), ("agentic_rl/a.py", "a `thing`")]
    assert _modules(tmp_path) - {"agentic_rl/", "agentic_rl/a.py"} == {"agentic_rl/sub/", "ascend/"}
