"""The package is laid out by `ruff format` (pyproject's [tool.ruff]), with few lines kept out of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentic_rl", "ascend")
MAX_FMT_SKIPS = 20
_FMT_SKIP = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def _ruff() -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is a test dependency: install the project's [test] extra"
    return ruff


def test_the_package_is_formatted():
    result = subprocess.run(
        [_ruff(), "format", "--check", *PACKAGES], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"run `ruff format {' '.join(PACKAGES)}`:\n{result.stdout}{result.stderr}"


def _fmt_skips(source: str) -> int:
    return sum(1 for line in source.splitlines() if _FMT_SKIP.search(line))


def test_few_lines_are_kept_out_of_the_formatter():
    paths = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    counts = {str(p.relative_to(ROOT)): n for p in paths if (n := _fmt_skips(p.read_text(encoding="utf-8")))}
    assert sum(counts.values()) <= MAX_FMT_SKIPS, f"{sum(counts.values())} '# fmt: skip' markers: {counts}"


def test_the_marker_count_sees_skip_and_off():
    assert _fmt_skips("x = [1,2]  # fmt: skip\n# fmt: off\ny = 1\n# fmt: on\nz = '# fmt skip'\n") == 2
